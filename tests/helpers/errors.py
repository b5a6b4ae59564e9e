"""What a command's failure must look like: one `error: ...` line, the last on stderr."""

from __future__ import annotations


def assert_one_line_error(p, *words):
    """`p` (a finished subprocess, stderr captured) failed with exactly one error line, its
    last (progress bars may precede it: export), no traceback, and every one of `words` in it."""
    err = p.stderr.decode()
    assert p.returncode != 0
    assert "Traceback" not in err
    lines = err.splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], err
    for w in words:
        assert w in err, err
