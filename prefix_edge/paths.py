"""Where prefix-edge keeps things on the user's machine."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m"


def home() -> Path:
    """$PREFIX_EDGE_HOME, else the user's cache dir: on Linux platformdirs' own rule
    ($XDG_CACHE_HOME if absolute, else ~/.cache), without importing it (~9 ms of a cold start)."""
    env = os.environ.get("PREFIX_EDGE_HOME")
    if env:
        return Path(env).expanduser()
    if sys.platform.startswith("linux"):
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        return Path(xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache")) / "prefix-edge"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("prefix-edge"))


def default_bundle() -> Path:
    return home() / "bundles" / DEFAULT_MODEL_NAME


def prompt_cache_dir(fingerprint: str, backend: str) -> Path:
    """The prompt cache's files for one model and engine (runtime/cache/prompt_files.py)."""
    safe = "".join(c for c in fingerprint if c.isalnum())[:32] or "unknown"
    return home() / "prompt-cache" / safe / backend


SECRET = "secret.key"
SECRET_BYTES = 32


def secret_key() -> bytes:
    """This home's secret (32 random bytes in $PREFIX_EDGE_HOME/secret.key, mode 0600, made on
    first use): the key of the MAC over every state file this home persists
    (bundle/prefixfile.py), so that only a file a process of this user wrote is read back.
    A key file that is not a regular file of this user's, is open to others, or is not 32
    bytes is replaced by a new one (files made with the old key are then refused and made
    again). OSError where the home cannot hold one."""
    path = home() / SECRET
    for _ in range(3):
        key = _read_secret(path)
        if key is not None:
            return key
        _make_secret(path)
    raise OSError(f"{path}: cannot keep this home's secret there")


def _read_secret(path: Path) -> bytes | None:
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
        if not (stat.S_ISREG(st.st_mode) and mine and not st.st_mode & 0o077):
            return None
        key = os.read(fd, SECRET_BYTES + 1)
        return key if len(key) == SECRET_BYTES else None
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk (a rename made durable); where the OS or
    the path does not allow it, nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_secret(path: Path) -> None:
    """A new key at `path`: written to a temporary file (0600) then linked in, so a process
    that reads it never sees half a key; the first of several processes wins, one that finds
    a bad key file replaces it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SECRET}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600) if hasattr(os, "fchmod") else None
        os.write(fd, os.urandom(SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if os.path.lexists(path):
            os.replace(tmp, path)  # a bad key file (the caller could not read it as one)
        else:
            os.link(tmp, path)
    except FileExistsError:
        pass  # another process made one meanwhile: read that
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def default_tasks_file() -> Path:
    """The demo tasks for the embedded default model (package data: `prefix_edge/models/`)."""
    return Path(__file__).resolve().parent / "models" / DEFAULT_MODEL_NAME / "tasks.toml"


DEMO_SUFFIXES = ("_tuned", "_distilled", "_prompt")  # a demo task's trained or distilled twins


def demo_data(task: str) -> Path | None:
    """The embedded held-out set of a demo task (`models/<default>/data/<task>.heldout.jsonl`);
    a trained or distilled twin (`sentiment_tuned`) shares its prompt task's set."""
    data = default_tasks_file().parent / "data"
    names = [task] + [task[: -len(s)] for s in DEMO_SUFFIXES if task.endswith(s)]
    return next((data / f"{n}.heldout.jsonl" for n in names if (data / f"{n}.heldout.jsonl").is_file()), None)


def read_cache(name: str) -> dict:
    """A JSON object cached in $PREFIX_EDGE_HOME; missing or corrupt reads as {} (a cache only
    ever saves work)."""
    try:
        data = json.loads((home() / name).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(name: str, data: dict) -> None:
    """Atomically replace a JSON cache in $PREFIX_EDGE_HOME; a read-only home is not an error."""
    path = home() / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass
