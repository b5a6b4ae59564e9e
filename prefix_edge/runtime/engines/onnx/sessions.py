"""The ONNX engine's InferenceSessions of its model: the full one, and while the CPUs are
contended a lean one.

ONNX Runtime fixes a session's thread pool when it is made, and that pool spins at every op's
barrier: beside a busy loop the full session decoded 34 tok/s where one thread decoded 69, and
spinning off everywhere costs 30 % on an idle machine. So with threads "auto" (adaptive) a
forward leases its threads from the process's CPU share (engines/cpu_share.py) and, when fewer are
free than the full session runs, runs on a lean session of the same model: made the first time,
with the threads free then, none spinning. Thread counts change no logit (tests/test_cpu_share.py).
A background runtime's one session never spins, and its forwards run on lowered threads.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from ....errors import PrefixEdgeError
from ..cpu_share import cpu_share, lower_this_thread


class Sessions:
    def __init__(self, model_path: Path, device: str, threads: int | None, verify: str,
                 model_sha256: str | None, adaptive: bool = False, background: bool = False):
        self._args = (model_path, device, verify, model_sha256)
        self.threads, self.background = threads, bool(background)
        self.adaptive = bool(adaptive) and device == "cpu" and bool(threads) and threads > 1
        self.full, self.source = open_session(model_path, device, threads, verify, model_sha256,
                                              spin=not self.background)
        self._lean = None  # made at the first contended forward

    @contextmanager
    def running(self):
        """The session a forward runs on now (held against this process's other forwards)."""
        if self.background:
            lower_this_thread()
        if not self.adaptive or self.full is None:
            yield self.full
            return
        with cpu_share().lease(self.threads) as n:
            yield self.full if n >= self.threads else self._lean_session(n)

    def _lean_session(self, n: int):
        if self._lean is None:
            path, device, verify, sha = self._args
            self._lean = open_session(path, device, n, verify, sha, spin=False)[0]
        return self._lean

    def close(self) -> None:
        self.full = self._lean = None


def open_session(model_path: Path, device: str, threads: int | None, verify: str = "cached",
                 model_sha256: str | None = None, spin: bool = True):
    """An InferenceSession of the model and where it came from: "cache" / "saved" (this
    machine's saved optimized, prepacked form of it: ort_cache.py) or "model" (built from the
    model; GPU, cache off or unusable). `model_sha256`: the model file's hash when the caller has
    it (else looked up like bundle files); verify "full" re-hashes the cache entry's files at this
    open. spin False: the pool's threads sleep at a barrier."""
    import onnxruntime as ort

    from . import ort_cache

    def options(optimize: bool):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                         else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        if not spin:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        return opts

    providers = (["CUDAExecutionProvider"] if device == "cuda" else []) + ["CPUExecutionProvider"]
    if device == "cpu" and ort_cache.enabled():
        if model_sha256 is None:
            from ....bundle.verify import file_hashes

            try:
                model_sha256 = file_hashes(model_path.parent, [model_path.name])[model_path.name]
            except PrefixEdgeError:
                pass  # a missing file: the plain open below says so
        got = ort_cache.session(model_path, options, providers, model_sha256, verify) if model_sha256 else None
        if got is not None:
            return got
    try:
        return ort_cache.new_session(model_path, options(True), providers), "model"
    except Exception as e:  # ORT raises its own types; give one line
        raise PrefixEdgeError(f"cannot load ONNX model {model_path}: {str(e).splitlines()[0]}") from None
