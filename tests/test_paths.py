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


def test_the_home_secret_is_private_and_replaced_when_it_is_not(monkeypatch, tmp_path):
    """secret_key(): 32 bytes made once (mode 0600), the same on every call and in every
    process of the home; a key file others may read, of another size, or a symbolic link is
    replaced by a new key (never used)."""
    import os
    import stat
    import subprocess
    import sys

    from prefix_edge.paths import secret_key

    monkeypatch.setenv("PREFIX_EDGE_HOME", str(tmp_path))
    key = secret_key()
    path = tmp_path / "secret.key"
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600 and secret_key() == key
    other = subprocess.run([sys.executable, "-c", "from prefix_edge.paths import secret_key; "
                            "print(secret_key().hex())"], capture_output=True, text=True, check=True,
                           env={**os.environ, "PREFIX_EDGE_HOME": str(tmp_path)})
    assert other.stdout.strip() == key.hex()
    os.chmod(path, 0o644)  # readable by others: no longer a secret
    new = secret_key()
    assert new != key and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_bytes(b"short")
    os.chmod(path, 0o600)
    assert secret_key() not in (new, b"short")
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(bytes(32))
    os.chmod(tmp_path / "elsewhere", 0o600)
    path.symlink_to(tmp_path / "elsewhere")
    assert secret_key() != bytes(32) and not path.is_symlink()
