"""ONNX Runtime's optimized, prepacked form of a model, cached on this machine.

Every session ONNX Runtime opens re-optimizes the graph and repacks each MatMulNBits weight for
this CPU's kernels, holding the loaded and the packed weights: on the default model ~230 ms of a
cold start and ~220 MB of RSS for a 148 MB file. The first open of a model on the CPU saves what
it built (`optimized_model_filepath` with `session.save_external_prepacked_constant_initializers`:
the graph after optimization, the prepacked weights in its external data file); later opens load
that with optimization off and use the saved packs as they are (measured: open 185 vs 377 ms,
RSS 206 vs 262 MB; logits bit-identical, tests/test_ort_cache.py).

ONNX Runtime warns that the saved form fits the machine and version that made it, so an entry's
key is sha256 over the model file's sha256, the onnxruntime version, the architecture, every CPU
flag and CACHE_FORMAT: another CPU or ORT gets its own entry. An entry lives in
$PREFIX_EDGE_HOME/ort-cache/<key>/ and counts only once `entry.json` (the files' sha256, written
last) is there; its files are verified as model files are (bundle/verify.py: the sha256 is
remembered by stat identity), and a mismatch means the entry is rebuilt, never used. At most
KEEP entries are kept (least recently used go). PREFIX_EDGE_ORT_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from pathlib import Path

CACHE_FORMAT = "1"
# ONNX Runtime reads a model under the GIL, then optimizes / prepacks without it: what runs
# beside a session's creation (overlap.py) starts this far in (measured on the default model:
# no overlap starting at 10 ms, full overlap from 20 ms)
PARSE_S = 0.03
KEEP = 4
FILES = ("model.onnx", "model.onnx.data")


def enabled() -> bool:
    return os.environ.get("PREFIX_EDGE_ORT_CACHE", "1") != "0"


def entry_key(model_sha256: str) -> str:
    import onnxruntime as ort

    from ..cpus import cpu_flags

    h = hashlib.sha256()
    for part in (CACHE_FORMAT, model_sha256, ort.__version__, platform.machine(),
                 " ".join(sorted(cpu_flags()))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _root() -> Path:
    from ....paths import home

    return home() / "ort-cache"


def cached_model(model_sha256: str, verify: str = "cached") -> Path | None:
    """The cached optimized model for this model here, verified; None when there is none (or
    it does not verify: it is then removed)."""
    from ....bundle.verify import file_hashes
    from ....errors import PrefixEdgeError

    entry = _root() / entry_key(model_sha256)
    try:
        want = json.loads((entry / "entry.json").read_text())["sha256"]
        have = file_hashes(entry, FILES, verify)
        if [have[f] for f in FILES] != [want[f] for f in FILES]:
            raise ValueError("changed")
        os.utime(entry / "entry.json")  # most recently used
    except FileNotFoundError:
        try:  # a dir without entry.json: being published, or left by a process that died
            if entry.is_dir() and (not _publisher_alive(entry)
                                   or entry.stat().st_mtime < time.time() - 600):
                shutil.rmtree(entry, ignore_errors=True)  # rebuilt by this open
        except OSError:
            pass
        return None
    except (OSError, ValueError, KeyError, TypeError, PrefixEdgeError):
        shutil.rmtree(entry, ignore_errors=True)
        return None
    return entry / FILES[0]


PUBLISHER = "publisher"  # the pid (and host) of the process that made an entry


def _publisher_alive(entry: Path) -> bool:
    """Whether the process that is publishing `entry` may still be at it (False once it is
    known dead: a kill -9 between the rename and entry.json leaves such a dir)."""
    try:
        host, _, pid = (entry / PUBLISHER).read_text().partition(" ")
        pid_n = int(pid)
    except (OSError, ValueError):
        return True  # unknown: only the age rule applies
    if host != platform.node():
        return True
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: alive
        return True
    return True


def session(model_path: Path, options, providers: list[str], model_sha256: str, verify: str = "cached"):
    """An InferenceSession of the model through this cache, and where it came from: "cache"
    (the saved entry, optimization off) or "saved" (built from the model, the entry made on the
    way); None when neither worked (the caller opens the model plainly and reports its error).
    `options(optimize)` makes the caller's SessionOptions."""
    cached = cached_model(model_sha256, verify)
    if cached is not None:
        try:
            return new_session(cached, options(False), providers), "cache"
        except Exception:  # noqa: BLE001 - an entry ORT refuses is dropped and rebuilt
            shutil.rmtree(cached.parent, ignore_errors=True)
    opts = options(True)
    opts.log_severity_level = 3  # not ORT's warning that the saved form fits this machine only
    staging = _save_options(opts, model_sha256)
    if staging is None:
        return None
    try:
        made = new_session(model_path, opts, providers)
    except Exception:  # noqa: BLE001 - saving failed (disk full?): the caller opens it plainly
        shutil.rmtree(staging, ignore_errors=True)
        return None
    _publish(staging, model_sha256)
    return made, "saved"


def new_session(path: Path, opts, providers: list[str]):
    """An InferenceSession of `path`, made with what the opening thread has pending beside it
    (overlap.py: Runtime.open's tokenizer), PARSE_S into the creation."""
    import onnxruntime as ort

    from ..overlap import native_load

    return native_load(lambda: ort.InferenceSession(str(path), opts, providers=providers), PARSE_S)


def _save_options(opts, model_sha256: str) -> Path | None:
    """Set `opts` so the session being created also writes its optimized form into a new
    entry's staging dir (returned; _publish() it after the session is made), or None when the
    cache dir cannot be written."""
    staging = _root() / f".{entry_key(model_sha256)}.tmp-{os.getpid()}"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        (staging / PUBLISHER).write_text(f"{platform.node()} {os.getpid()}")
    except OSError:
        return None
    opts.optimized_model_filepath = str(staging / FILES[0])
    opts.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", FILES[1])
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    return staging


def _publish(staging: Path, model_sha256: str) -> None:
    """Make a staged entry visible (hashes recorded last); a concurrent process that got there
    first wins. Failures only leave the cache without this entry."""
    from ....bundle.verify import file_hashes
    from ....errors import PrefixEdgeError

    entry = _root() / entry_key(model_sha256)
    try:
        if not all((staging / f).is_file() for f in FILES):
            raise OSError("ONNX Runtime wrote no optimized model")
        os.rename(staging, entry)
    except OSError:  # not written, or another process published this entry first
        shutil.rmtree(staging, ignore_errors=True)
        return
    try:  # hashed at their final paths, so the next open finds them in the hash cache
        hashes = file_hashes(entry, FILES, "cached")
        tmp = entry / f".entry.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps({"sha256": hashes, "format": CACHE_FORMAT}))
        os.replace(tmp, entry / "entry.json")
    except (OSError, PrefixEdgeError):
        shutil.rmtree(entry, ignore_errors=True)
        return
    _evict()


def summary() -> dict:
    """What the cache holds here: its dir, whether it is on, entries and bytes (for doctor)."""
    entries, size = 0, 0
    root = _root()
    if root.is_dir():
        for d in root.iterdir():
            if (d / "entry.json").is_file():
                entries += 1
                size += sum(f.stat().st_size for f in d.iterdir() if f.is_file())
    return {"dir": str(root), "enabled": enabled(), "entries": entries, "bytes": size}


def _evict() -> None:
    entries = []
    for d in _root().iterdir():
        try:
            entries.append(((d / "entry.json").stat().st_mtime, d))
        except OSError:
            continue
    for _, d in sorted(entries, reverse=True)[KEEP:]:
        shutil.rmtree(d, ignore_errors=True)
