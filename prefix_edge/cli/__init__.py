"""The `prefix-edge` command. Every PrefixEdgeError becomes one line on stderr and exit 1."""

from __future__ import annotations

import sys

import typer

from ..errors import PrefixEdgeError, disk_full
from .app import app


def _register() -> None:
    from . import bench, distill, doctor, eval, export, inspect, run, serve, task, train, verify  # noqa: F401  (each module adds its commands to `app`)


def main(argv: list[str] | None = None) -> None:
    import os

    # the command reports its own stages; transformers 5 draws a bar of its own for every model it
    # loads (eval's reference, export's fidelity check), read from this variable when it is imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # (e.g. its kernels' "falling back" notices)
    _register()
    try:
        rc = app(args=argv, standalone_mode=False)  # click returns an Exit's code here
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except PrefixEdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # click usage errors (click's, or the copy typer vendors)
        if disk_full(e):
            where = getattr(e, "filename", None)
            print(f"error: No space left on device{f' writing {where}' if where else ''}: free "
                  "some space or use another disk", file=sys.stderr)
            sys.exit(1)
        show, code = getattr(e, "show", None), getattr(e, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            sys.exit(code)
        raise
