"""Does llama.cpp run on this CPU? Asked once per llama.cpp build, in a child process.

A llama.cpp compiled with -march=native on one machine (pip's default for llama-cpp-python) can
die with SIGILL on another: seen on a VM whose CPU advertises AMX while the hypervisor traps it.
A signal cannot be caught in-process, so before the gguf backend is used for the first time, a
child process loads a GGUF model and decodes a few tokens. Its verdict is cached in
$PREFIX_EDGE_HOME/llama-probe.json, keyed by the sha256 of llama-cpp-python's native libraries
(a rebuilt library is probed again).

`PREFIX_EDGE_PROBE_FAULT=SIGILL` (or another signal name) makes the child kill itself with that
signal after importing llama_cpp: how the tests exercise the crash path on a machine where
llama.cpp works.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..paths import read_cache, write_cache

FIX = ("rebuild llama-cpp-python portable: bash scripts/llama-wheel.sh (or pip install "
       "--force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python with "
       "CMAKE_ARGS=-DGGML_NATIVE=OFF)")
TIMEOUT_S = 120
CACHE = "llama-probe.json"

_CHILD = r"""
import ctypes, os, signal, sys
import llama_cpp as L
fault = os.environ.get("PREFIX_EDGE_PROBE_FAULT")
if fault:
    os.kill(os.getpid(), getattr(signal, fault))
cb = L.llama_log_callback(lambda level, text, user_data: None)
L.llama_log_set(cb, ctypes.c_void_p(0))
L.llama_backend_init()
print("SYSTEM_INFO " + L.llama_print_system_info().decode("utf-8", "replace").strip(), flush=True)
path = sys.argv[1] if len(sys.argv) > 1 else ""
if path:
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        print("ERROR cannot load " + path, flush=True)
        sys.exit(3)
    cp = L.llama_context_default_params()
    cp.n_ctx = 64
    cp.n_batch = 64
    cp.n_threads = cp.n_threads_batch = 1
    ctx = L.llama_init_from_model(model, cp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    batch = L.llama_batch_init(16, 0, 1)
    ids = [1 % n_vocab, 2 % n_vocab, 3 % n_vocab, 4 % n_vocab]
    for step in range(2):  # a prefill of several tokens, then a one-token decode
        n = len(ids) if step == 0 else 1
        for i in range(n):
            batch.token[i] = ids[i] if step == 0 else ids[-1]
            batch.pos[i] = i if step == 0 else len(ids)
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i == n - 1 else 0
        batch.n_tokens = n
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            print("ERROR llama_decode returned %d" % rc, flush=True)
            sys.exit(4)
    print("DECODED", flush=True)
print("OK " + L.__version__, flush=True)
"""


@dataclass
class Verdict:
    ok: bool
    detail: str  # one line: what happened
    library_sha256: str
    version: str = ""
    system_info: str = ""
    decoded: bool = False  # a model was loaded and decoded (not just imported)
    checked_at: str = ""


def library_files() -> list[Path]:
    """llama-cpp-python's native libraries, found without importing it ([] if not installed)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    pkg = Path(next(iter(spec.submodule_search_locations)))
    return sorted(p for p in pkg.rglob("*") if p.is_file()
                  and (p.suffix in (".so", ".dylib", ".dll") or ".so." in p.name))


def library_key(files: list[Path]) -> str:
    """One sha256 over the native libraries' hashes, each remembered by stat identity
    (bundle/verify.py), so a runtime start does not re-read ~18 MB of libraries."""
    from ..bundle.verify import file_hashes

    hashes = file_hashes(Path(files[0].anchor), [str(p) for p in files])  # absolute paths
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(hashes[str(p)].encode())
    return h.hexdigest()


# system libraries llama.cpp's native code needs at run time, and the package that provides them
_PROVIDERS = {
    "libgomp.so.1": "libgomp1 (Debian/Ubuntu: apt-get install libgomp1; Alpine: apk add libgomp; "
                    "Fedora: dnf install libgomp)",
    "libstdc++.so.6": "libstdc++6 (Debian/Ubuntu: apt-get install libstdc++6; Alpine: apk add libstdc++)",
    "libgcc_s.so.1": "libgcc-s1 (Debian/Ubuntu: apt-get install libgcc-s1; Alpine: apk add libgcc)",
    "libcuda.so.1": "the NVIDIA driver",
    "libcudart.so.12": "the CUDA runtime (nvidia-cuda-runtime-cu12, or the CUDA toolkit)",
    "libcublas.so.12": "cuBLAS (nvidia-cublas-cu12, or the CUDA toolkit)",
}
_MISSING = re.compile(r"([\w.+-]+\.(?:so(?:\.\d+)*|dylib)): cannot open shared object file|"
                      r"Library not loaded: \S*?([\w.+-]+\.dylib)")


def missing_library(log: str) -> str:
    """"a system library is missing: NAME (install PACKAGE)" when the dynamic loader said so in
    `log` (ctypes' OSError inside llama-cpp-python's RuntimeError), else ""."""
    m = _MISSING.search(log)
    if not m:
        return ""
    name = m.group(1) or m.group(2)
    where = _PROVIDERS.get(name)
    return (f"a system library llama.cpp needs is missing: {name}"
            + (f" (install {where})" if where else " (install the package that provides it)"))


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def run_probe(model_path: Path | None, key: str) -> Verdict:
    """Run the child; never raises for what the child does."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args = [sys.executable, "-c", _CHILD] + ([str(model_path)] if model_path else [])
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Verdict(False, f"llama.cpp probe hung for {TIMEOUT_S} s", key, checked_at=now)
    lines = p.stdout.splitlines()
    info = next((ln[12:] for ln in lines if ln.startswith("SYSTEM_INFO ")), "")
    version = next((ln[3:] for ln in lines if ln.startswith("OK ")), "")
    decoded = "DECODED" in lines
    if p.returncode < 0:
        name = _signal_name(p.returncode)
        what = " (an instruction this CPU or VM does not allow)" if name == "SIGILL" else ""
        stage = "decoding a test model" if info else "starting"
        return Verdict(False, f"llama.cpp died with {name}{what} while {stage}; {FIX}",
                       key, version, info, False, now)
    if p.returncode != 0:
        err = next((ln for ln in lines if ln.startswith("ERROR ")), "")
        last = err[6:] if err else ((p.stderr.strip().splitlines() or ["no output"])[-1])
        missing = missing_library(p.stdout + "\n" + p.stderr)
        if missing:
            last = missing
        return Verdict(False, f"llama.cpp probe failed (exit {p.returncode}): {last}", key,
                       version, info, False, now)
    return Verdict(True, "decoded a test model" if decoded else "imported (no model to decode)",
                   key, version, info, decoded, now)


def llama_verdict(model_path: Path | None = None, refresh: bool = False) -> Verdict | None:
    """The cached verdict for the installed llama.cpp build (probing it if needed), or None when
    llama-cpp-python is not installed. A cached verdict that only imported (no model was at hand)
    is re-probed once a model is given."""
    files = library_files()
    if not files:
        return None
    key = library_key(files)
    fault = os.environ.get("PREFIX_EDGE_PROBE_FAULT")
    cache = read_cache(CACHE)
    hit = cache.get(key)
    if hit and not refresh and not fault:
        try:
            v = Verdict(**hit)
            if v.decoded or model_path is None or not v.ok:
                return v
        except TypeError:
            pass
    v = run_probe(model_path, key)
    if not fault:  # an injected fault says nothing about this build
        cache[key] = asdict(v)
        write_cache(CACHE, cache)
    return v


def require_llama(model_path: Path | None) -> None:
    """Raise a one-line PrefixEdgeError if llama.cpp cannot run here."""
    from ..errors import PrefixEdgeError

    v = llama_verdict(model_path)
    if v is not None and not v.ok:
        raise PrefixEdgeError(f"the gguf backend cannot run on this machine: {v.detail}")


def unusable(model_path: Path | None) -> str | None:
    """Why the installed llama.cpp cannot run here (the probe's one line), or None (also when
    llama-cpp-python is not installed: that is said where it is imported)."""
    model = model_path if model_path is not None and model_path.is_file() else None
    v = llama_verdict(model)
    return v.detail if v is not None and not v.ok else None


