"""Model-file hashes for the fingerprint check, without re-hashing hundreds of MB per open.

Hashing a 200 MB model costs ~0.35 s here, most of a cold start. A file's sha256 is computed
once and remembered in `$PREFIX_EDGE_HOME/verified.json` together with the file's stat
identity (device, inode, size, mtime_ns, ctime_ns); an open whose stat identity matches reuses
the hash. Any write to the file changes mtime/ctime, so a changed model is hashed again and
refused. `verify="full"` always hashes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..bundle import sha256_file
from ..errors import PrefixEdgeError


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_hashes(root: Path, rel_paths, verify: str = "cached") -> dict[str, str]:
    if verify not in ("cached", "full"):
        raise PrefixEdgeError(f"verify must be 'cached' or 'full', not {verify!r}")
    from ..paths import home

    cache_path = home() / "verified.json"
    try:
        cache = json.loads(cache_path.read_text()) if verify == "cached" else {}
    except (OSError, ValueError, RecursionError):
        cache = {}
    if not isinstance(cache, dict):  # a corrupt cache only costs a re-hash
        cache = {}
    out, changed = {}, False
    for rel in rel_paths:
        p = (root / rel).resolve()
        try:
            st = p.stat()
        except OSError:
            raise PrefixEdgeError(f"bundle {root}: model file {rel} is missing") from None
        entry = cache.get(str(p))
        if isinstance(entry, dict) and entry.get("stat") == _stamp(st) and isinstance(entry.get("sha256"), str):
            out[rel] = entry["sha256"]
            continue
        out[rel] = sha256_file(p)
        cache[str(p)] = {"stat": _stamp(st), "sha256": out[rel]}
        changed = True
    if changed and verify == "cached":
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_path)
        except OSError:
            pass  # a read-only home only costs the re-hash next time
    return out
