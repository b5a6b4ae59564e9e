"""paths.py: where prefix-edge keeps things on the user's machine."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("xdg", [None, "/tmp/xdg-cache", "   ", "relative/cache"])
def test_home_is_platformdirs_cache_dir_without_importing_it(monkeypatch, xdg):
    """paths.home() spells platformdirs' Linux rule itself (importing platformdirs costs ~9 ms of
    a cold start); it must name the same directory."""
    import sys

    from platformdirs import user_cache_dir

    from prefix_edge.paths import home

    if not sys.platform.startswith("linux"):
        pytest.skip("the inline rule is Linux's")
    monkeypatch.delenv("PREFIX_EDGE_HOME", raising=False)
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert str(home()) == user_cache_dir("prefix-edge")
