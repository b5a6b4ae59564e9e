"""Where prefix-edge keeps things on the user's machine."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_NAME = "smollm2-135m"


def home() -> Path:
    """$PREFIX_EDGE_HOME, else the user's cache dir."""
    env = os.environ.get("PREFIX_EDGE_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("prefix-edge"))


def default_bundle() -> Path:
    return home() / "bundles" / DEFAULT_MODEL_NAME


def default_tasks_file() -> Path:
    """The demo tasks for the embedded default model (package data: `prefix_edge/models/`)."""
    return Path(__file__).resolve().parent / "models" / DEFAULT_MODEL_NAME / "tasks.toml"
