"""Model-file hashes for the fingerprint check, without re-hashing hundreds of MB per open.

Hashing a 200 MB model costs ~0.35 s here, most of a cold start. A file's sha256 is computed
once and remembered in `$PREFIX_EDGE_HOME/verified/ROOT.json` (one small file per bundle or
directory, so a lookup reads only that bundle's entries) together with the file's stat
identity (device, inode, size, mtime_ns, ctime_ns); an open whose stat identity matches reuses
the hash. Any write to the file changes mtime/ctime, so a changed model is hashed again and
refused. `verify="full"` always hashes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import PrefixEdgeError


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_files(root: Path, rel_paths) -> dict[str, str]:
    """Every file's sha256, hashed now (export; `prefix-edge verify`)."""
    out = {}
    for rel in rel_paths:
        p = root / rel
        if not p.is_file():
            raise PrefixEdgeError(f"bundle {root}: model file {rel} is missing")
        out[rel] = sha256_file(p)
    return out


MAX_ENTRIES = 1024  # a cache file keeps the most recently verified files only
MAX_CHECKS = 8      # verdicts kept per file (one per engine and model it was checked for)
_MEM: dict[str, dict] = {}  # this process's verified files (same entries as the file)


def cache_name(root: Path) -> str:
    """The cache file (under $PREFIX_EDGE_HOME) of the files under `root`."""
    key = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:24]
    return f"verified/{key}.json"


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_hashes(root: Path, rel_paths, verify: str = "cached") -> dict[str, str]:
    if verify not in ("cached", "full"):
        raise PrefixEdgeError(f"verify must be 'cached' or 'full', not {verify!r}")
    from ..paths import read_cache, write_cache

    out, stats, missing = {}, {}, []
    for rel in rel_paths:
        p = (root / rel).resolve()
        try:
            st = p.stat()
        except OSError:
            raise PrefixEdgeError(f"bundle {root}: model file {rel} is missing") from None
        stats[rel] = (p, st)
        entry = _MEM.get(str(p)) if verify == "cached" else None
        if entry and entry["stat"] == _stamp(st):
            out[rel] = entry["sha256"]
        else:
            missing.append(rel)
    if not missing:
        return out  # the hot path: no file I/O beyond one stat per file
    cache = read_cache(cache_name(root)) if verify == "cached" else {}
    changed = False
    for rel in missing:
        p, st = stats[rel]
        entry = cache.get(str(p))
        checks: list = []
        if isinstance(entry, dict) and entry.get("stat") == _stamp(st) and isinstance(entry.get("sha256"), str):
            out[rel] = entry["sha256"]
            checks = [c for c in entry.get("checks", []) if isinstance(c, str)][-MAX_CHECKS:]
        else:
            out[rel] = sha256_file(p)
            cache.pop(str(p), None)
            cache[str(p)] = {"stat": _stamp(st), "sha256": out[rel]}
            changed = True
        _MEM[str(p)] = {"stat": _stamp(st), "sha256": out[rel], "checks": checks}
    if changed and verify == "cached":
        while len(cache) > MAX_ENTRIES:  # oldest first
            cache.pop(next(iter(cache)))
        write_cache(cache_name(root), cache)
    while len(_MEM) > MAX_ENTRIES:
        _MEM.pop(next(iter(_MEM)))
    return out


def passed(root: Path, rel: str, check: str) -> bool:
    """Whether the file, unchanged since its hash was taken here (the same stat identity, in
    "cached" verification), already passed `check` (an engine's check of its contents for one
    model): its O(bytes) walk need not run again."""
    p = (root / rel).resolve()
    entry = _MEM.get(str(p))
    if not entry or check not in entry.get("checks", ()):
        return False
    try:
        return entry["stat"] == _stamp(p.stat())
    except OSError:
        return False


def remember_pass(root: Path, rel: str, check: str) -> None:
    """Record that the file (as hashed) passed `check`, for this process and the next ones."""
    from ..paths import read_cache, write_cache

    p = (root / rel).resolve()
    entry = _MEM.get(str(p))
    if entry is None or check in entry.get("checks", ()):
        return
    entry["checks"] = [*entry.get("checks", []), check][-MAX_CHECKS:]
    cache = read_cache(cache_name(root))
    disk = cache.get(str(p))
    if isinstance(disk, dict) and disk.get("stat") == entry["stat"] and disk.get("sha256") == entry["sha256"]:
        disk["checks"] = entry["checks"]
        write_cache(cache_name(root), cache)
