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
