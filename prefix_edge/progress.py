"""Progress display for export stages (rich, on stderr)."""

from __future__ import annotations

import contextlib
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def bars(enabled: bool = True, transient: bool = False) -> Progress:
    """Progress bars on stderr for train, distill and eval: description, bar, n/total, elapsed,
    remaining, and a free `info` field (give `info=""` to add_task)."""
    from rich.progress import TimeRemainingColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                    console=Console(stderr=True), disable=not enabled, transient=transient)


class Stages:
    def __init__(self, enabled: bool = True):
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.timings: dict[str, float] = {}
        self.warnings: list[str] = []
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=self.console,
                                  disable=not enabled, transient=False)

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        self._progress.__exit__(*exc)

    @contextlib.contextmanager
    def stage(self, description: str, total: int = 1):
        """A stage with `total` steps; yields an `advance()` callable."""
        tid = self._progress.add_task(description, total=total)
        t0 = time.perf_counter()
        yield lambda n=1: self._progress.advance(tid, n)
        self._progress.update(tid, completed=total)
        self.timings[description] = round(time.perf_counter() - t0, 2)

    def warn(self, msg: str) -> None:
        """A problem that does not stop the export: one line on stderr, kept in `warnings`."""
        self.warnings.append(msg)
        self.console.print(f"warning: {msg}", style="yellow", markup=False, highlight=False)
