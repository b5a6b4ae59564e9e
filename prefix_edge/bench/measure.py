"""`prefix-edge bench`: what the prefix cache buys, measured against baselines in the same run.

Everything here runs through the runtime's own Backend objects (no torch in this process);
peers that need other libraries run as subprocesses from `benchmarks/`. Each figure is the
median of several runs, with its ratio to the baseline measured in the same run:

  a. TTFT with the prefix prefilled vs restored from its baked file (and from memory, as a
     runtime's LRU serves a task after its first request), per prefix length
  b. task switch: requests alternating over 3 tasks of ~1k tokens, ms until the prefix is ready
  c. decode tok/s vs a plain llama-cpp-python loop (gguf) and optimum's generate (onnx)
  d. cold start (open bundle -> first token) and peak RSS of a run, in a fresh process
  e. a prefix restored from its file in a fresh process, every check included (the first load
     of a file walks its values; later ones, the file unchanged and passed, skip the walk)
  f. bytes per prefix token stored
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..errors import PrefixEdgeError
from .peer import PeerLoop

# Deterministic filler text for synthetic prefixes of any length (tokenized by the bundle's
# tokenizer; only the token count matters for timing).
_CORPUS = (
    "The support desk answers questions about storage plans, billing, devices and sync. "
    "Files deleted from a device stay in the trash for a number of days that depends on the plan. "
    "Customers can resume sync from the network settings when a metered connection paused it. "
    "Refunds for annual plans are paid within fourteen days of the cancellation request. "
)
_INPUT = "Question {i}: how do I move my photos from an old phone to the new tablet without losing albums? "
BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def _median(xs) -> float:
    return round(float(statistics.median(xs)), 3)


def _ids(tokenizer, text: str, n: int) -> np.ndarray:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    while len(ids) < n:
        ids = ids + ids
    return np.array(ids[:n], np.int64)


def _byte_compiled() -> None:
    """The fresh processes below run this package as an install does: pip byte-compiles a
    wheel's modules when it installs them, but an editable checkout under
    PYTHONDONTWRITEBYTECODE has none, and each process would compile ~40 modules (~40 ms)."""
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1]), quiet=2)


class Bench:
    def __init__(self, bundle: Path, threads: int, runs: int, log=print):
        from tokenizers import Tokenizer

        self.bundle, self.threads, self.runs, self.log = bundle, threads, runs, log
        self.opened = Bundle.open(bundle)
        self.manifest = self.opened.manifest
        self.tokenizer = Tokenizer.from_file(str(self.opened.tokenizer_file))
        self.tmp = Path(tempfile.mkdtemp(prefix="prefix-edge-bench-"))
        _byte_compiled()

    def model_file(self, backend: str) -> Path:
        return self.opened.model_file(backend)

    def engine_options(self, backend: str) -> dict:
        """What the bundle's prefixes need of an engine beyond the model file (llama.cpp's KV
        type and state layout)."""
        from ..llamacpp.lib import gguf_state_options

        return gguf_state_options(self.manifest.backends[backend].state) if backend == "gguf" else {}

    def open(self, backend: str, n_ctx: int):
        from ..runtime.engines import open_backend

        return open_backend(backend, self.model_file(backend), threads=self.threads, n_ctx=n_ctx,
                            **self.engine_options(backend))

    def bake(self, be, ids: np.ndarray, name: str) -> Path:
        path = self.tmp / f"{be.name}-{name}.safetensors"
        be.begin(None)
        be.prefill(ids)
        be.save_prefix(path, ids, {"fingerprint": "bench", "task": name})
        return path

    # a. TTFT ------------------------------------------------------------------------------
    def ttft(self, be, lengths: list[int], n_input: int) -> list[dict]:
        rows = []
        inp = _ids(self.tokenizer, _INPUT.format(i=0), n_input)
        for P in lengths:
            ids = _ids(self.tokenizer, _CORPUS, P)
            path = self.bake(be, ids, f"p{P}")
            restored, prefilled = [], []
            for _ in range(self.runs):
                t0 = time.perf_counter()
                prefix = be.load_prefix(path)
                be.begin(prefix)
                int(np.argmax(be.prefill(inp)))
                restored.append(_ms(t0))
            memory = []  # the prefix already loaded: what a runtime's LRU serves after a task's first request
            prefix = be.load_prefix(path)
            for _ in range(self.runs):
                t0 = time.perf_counter()
                be.begin(prefix)
                int(np.argmax(be.prefill(inp)))
                memory.append(_ms(t0))
            del prefix
            for _ in range(max(2, self.runs // 2)):
                t0 = time.perf_counter()
                be.begin(None)
                int(np.argmax(be.prefill(np.concatenate([ids, inp]))))
                prefilled.append(_ms(t0))
            row = {"backend": be.name, "prefix_tokens": P, "input_tokens": n_input,
                   "ttft_prefilled_ms": _median(prefilled), "ttft_restored_ms": _median(restored),
                   "ttft_restored_memory_ms": _median(memory),
                   "prefix_file_bytes": path.stat().st_size,
                   "bytes_per_prefix_token": round(path.stat().st_size / P, 1)}
            # three significant digits: a ratio under 0.005 (a tiny prefix, a busy CPU) is not 0
            row["speedup"] = float(f"{row['ttft_prefilled_ms'] / row['ttft_restored_ms']:.3g}")
            row["speedup_memory"] = float(f"{row['ttft_prefilled_ms'] / row['ttft_restored_memory_ms']:.3g}")
            self.log(f"  {be.name} P={P}: prefilled {row['ttft_prefilled_ms']:.1f} ms, "
                     f"restored {row['ttft_restored_ms']:.1f} ms ({row['speedup']}x), "
                     f"from memory {row['ttft_restored_memory_ms']:.1f} ms ({row['speedup_memory']}x)")
            rows.append(row)
        return rows

    # b. task switch ---------------------------------------------------------------------
    def task_switch(self, be, P: int = 1024, requests: int = 12) -> dict:
        paths = [self.bake(be, _ids(self.tokenizer, _INPUT.format(i=k) + _CORPUS, P), f"switch{k}")
                 for k in range(3)]
        prefixes = [be.load_prefix(p) for p in paths]  # what the runtime's LRU holds
        warm, cold = [], []
        for r in range(requests):
            k = r % 3
            t0 = time.perf_counter()
            be.begin(prefixes[k])
            warm.append(_ms(t0))
            t0 = time.perf_counter()
            be.begin(be.load_prefix(paths[k]))
            cold.append(_ms(t0))
        out = {"backend": be.name, "prefix_tokens": P, "tasks": 3, "requests": requests,
               "switch_ms_lru": _median(warm), "switch_ms_from_file": _median(cold)}
        self.log(f"  {be.name} task switch (P={P}): {out['switch_ms_lru']:.2f} ms from memory, "
                 f"{out['switch_ms_from_file']:.2f} ms from file")
        return out

    # c. decode --------------------------------------------------------------------------
    def decode(self, be, n_tokens: int = 64, P: int = 128, peer: "PeerLoop | None" = None) -> dict:
        """Greedy decode tok/s after a P-token prefix and 8 input tokens; with `peer`, its runs
        interleaved with these (one each per round, both loaded), and the ratio the median of
        the rounds' ratios, so a drift in the machine's speed hits both alike."""
        from ..runtime.decode.text import TextStream

        ids = _ids(self.tokenizer, _CORPUS, P)
        prefix = be.load_prefix(self.bake(be, ids, "decode"))
        speeds, peers = [], []
        for _ in range(max(3, self.runs)):
            be.begin(prefix)
            logits = be.prefill(_ids(self.tokenizer, _INPUT.format(i=1), 8))
            stream = TextStream(self.tokenizer, [])
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                tok = int(np.argmax(logits))
                stream.push(tok)
                logits = be.step(tok)
            speeds.append(n_tokens / (time.perf_counter() - t0))
            if peer is not None:
                peers.append(peer.run())
        out = {"backend": be.name, "tokens": n_tokens, "context": P + 8, "tok_s": _median(speeds)}
        if peers:
            out["baseline"] = {**peer.info, "tok_s": _median(peers), "interleaved_rounds": len(peers)}
            out["ratio"] = round(_median([a / b for a, b in zip(speeds, peers)]), 3)
        return out

    def peer_loop(self, script: str, *args) -> "PeerLoop | dict":
        """A peer baseline loaded in its own process, run once per call (or why it cannot)."""
        try:
            return PeerLoop([sys.executable, str(BENCH_DIR / script), *map(str, args), "--stdin"])
        except PrefixEdgeError as e:
            self.log(f"  peer {script} did not start: {e}")
            return {"error": str(e)}

    def peer(self, script: str, *args) -> dict | None:
        cmd = [sys.executable, str(BENCH_DIR / script), *map(str, args)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or ["?"])[-1]
            self.log(f"  peer {script} did not run: {tail}")
            return {"error": tail}
        return json.loads(p.stdout.strip().splitlines()[-1])

    def genai_peer(self, threads: int, n: int, ctx: int) -> dict:
        """onnxruntime-genai's int4 build of the same weights, from its own virtualenv."""
        py = BENCH_DIR / ".venv-genai" / "bin" / "python"
        if not py.exists():
            return {"error": "not installed: run benchmarks/setup_genai.sh"}
        from ..export.source import DEFAULT_GGUF
        from ..paths import home

        if self.manifest.model.source != DEFAULT_GGUF:
            return {"error": "only set up for the embedded default model"}
        cache = home() / "bench-cache" / "genai"
        hf = cache / "hf"
        if not (hf / "config.json").exists():  # the same de-quantized weights the bundle came from
            code = ("import sys; from pathlib import Path; from prefix_edge.export.source import "
                    "default_model_path, prepare_hf_dir; prepare_hf_dir(default_model_path(), Path(sys.argv[1]))")
            p = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True)
            if p.returncode != 0:
                return {"error": f"cannot prepare the HF weights: {p.stderr.strip().splitlines()[-1:]}"}
        p = subprocess.run([str(py), str(BENCH_DIR / "genai_generate.py"), str(hf), str(cache), str(threads),
                            str(n), str(ctx)], capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        return json.loads(p.stdout.strip().splitlines()[-1])

    # e. a prefix restored from its file in a fresh process ----------------------------------
    def restore_from_file(self, backend: str, P: int, n_ctx: int) -> dict:
        """A P-token prefix file restored in fresh processes, every check included: its hash
        looked up by stat identity (hashed once beforehand, as a deployed bundle's is), the
        codec's read, the engine's checks (the walk of its values on the file's first load; then
        skipped, the file having passed), seq_restore. The engine's open is not timed."""
        from ..bundle.verify import file_hashes

        path = self.tmp / f"{backend}-p{P}.safetensors"
        if not path.is_file():
            be = self.open(backend, n_ctx)
            try:
                self.bake(be, _ids(self.tokenizer, _CORPUS, P), f"p{P}")
            finally:
                be.close()
        file_hashes(path.parent, [path.name])  # hashed once, as at a bundle's first open
        extra = repr(self.engine_options(backend))
        code = (
            "import json, time\n"
            "from pathlib import Path\n"
            "from prefix_edge.bundle import prefixfile\n"
            "from prefix_edge.bundle.verify import file_hashes, passed, remember_pass\n"
            "from prefix_edge.runtime.engines import open_backend\n"
            f"be = open_backend({backend!r}, Path({str(self.model_file(backend))!r}), threads={self.threads}, "
            f"n_ctx={n_ctx}, **{extra})\n"
            f"root, rel = Path({str(path.parent)!r}), {path.name!r}\n"
            "t0 = time.perf_counter()\n"
            "file_hashes(root, [rel])\n"
            "tensors, meta = prefixfile.read(root / rel)\n"
            "checked = passed(root, rel, 'bench')\n"
            "prefix = be.prefix_from(tensors, meta, rel, values_checked=checked)\n"
            "be.seq_restore(0, prefix)\n"
            "ms = (time.perf_counter() - t0) * 1e3\n"
            "remember_pass(root, rel, 'bench')\n"
            "print(json.dumps({'ms': ms, 'walked': not checked}))\n")
        runs = []
        # the first: the file's first load (walked); at least 5 later ones: a fresh process's
        # first large allocations can stall on the kernel compacting huge pages (50-250 ms here,
        # mostly in the first processes after a heavy step), and all of them are reported
        for _ in range(max(self.runs, 5) + 1):
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise PrefixEdgeError(f"restore run failed: {p.stderr.strip().splitlines()[-1:]}")
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        first, later = runs[0], runs[1:]
        out = {"backend": backend, "prefix_tokens": P, "file_mb": round(path.stat().st_size / 1e6, 2),
               "first_load_walked_ms": round(first["ms"], 2),
               "restore_ms": _median(r["ms"] for r in later),
               "later_ms": [round(r["ms"], 2) for r in later],
               "walked": [r["walked"] for r in runs]}
        self.log(f"  {backend} {P}-token prefix from file in a fresh process: {out['restore_ms']:.1f} ms "
                 f"({out['first_load_walked_ms']:.1f} ms the first time, values walked), {out['file_mb']} MB")
        return out

    # d. cold start + RSS ----------------------------------------------------------------
    def cold_start(self, backend: str) -> dict:
        task = max(self.manifest.tasks, key=lambda t: self.manifest.tasks[t].prefix_tokens)
        code = (
            "import time, sys, json\n"
            "t0 = time.perf_counter()\n"
            "from prefix_edge import Runtime\n"
            f"rt = Runtime.open({str(self.bundle)!r}, backend={backend!r}, threads={self.threads})\n"
            f"r = rt.generate({task!r}, 'Where can I see if the service is down?', max_tokens=1)\n"
            "first = (time.perf_counter() - t0) * 1e3\n"
            f"rt.generate({task!r}, 'Where can I see if the service is down?', max_tokens=32)\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'optimum'})\n"
            # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forking parent
            "hwm = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
            "print(json.dumps({'cold_start_ms': first, 'peak_rss_bytes': hwm, 'heavy_imports': heavy}))\n")
        def measure(env: dict | None = None) -> list[dict]:
            runs = []
            for _ in range(3):
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                                   env={**os.environ, **(env or {})})
                if p.returncode != 0:
                    raise PrefixEdgeError(f"cold-start run failed: {p.stderr.strip().splitlines()[-1:]}")
                runs.append(json.loads(p.stdout))
            return runs

        # what a process of this runtime holds before any model: Python, the runtime's and the
        # engine library's imports, the tokenizer (peak RSS minus this is the model's share)
        lib = ("from prefix_edge.llamacpp.lib import load_llama_cpp; load_llama_cpp()"
               if backend == "gguf" else "import onnxruntime")
        fixed_code = ("import json\nfrom prefix_edge import Runtime\nfrom tokenizers import Tokenizer\n"
                      f"tok = Tokenizer.from_file({str(self.opened.tokenizer_file)!r})\n{lib}\n"
                      "hwm = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
                      "print(json.dumps({'peak_rss_bytes': hwm}))\n")
        fixed = []
        for _ in range(3):
            p = subprocess.run([sys.executable, "-c", fixed_code], capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise PrefixEdgeError(f"fixed-RSS run failed: {p.stderr.strip().splitlines()[-1:]}")
            fixed.append(json.loads(p.stdout)["peak_rss_bytes"])
        runs = measure()  # ONNX: through this machine's session cache (made by an earlier open)
        plain = measure({"PREFIX_EDGE_ORT_CACHE": "0"}) if backend == "onnx" else None
        info = self.manifest.backends[backend]
        model_bytes = sum((self.bundle / f).stat().st_size for f in info.files)
        prefix_bytes = self.manifest.tasks[task].prefixes[backend].bytes
        rss = _median(r["peak_rss_bytes"] for r in runs)
        out = {"backend": backend, "task": task, "cold_start_ms": _median(r["cold_start_ms"] for r in runs),
               "peak_rss_mb": round(rss / 1e6, 1), "model_mb": round(model_bytes / 1e6, 1),
               "prefix_mb": round(prefix_bytes / 1e6, 2),
               "rss_ratio": round(rss / (model_bytes + prefix_bytes), 2),
               "fixed_rss_mb": round(_median(fixed) / 1e6, 1),
               "model_rss_mb": round((rss - _median(fixed)) / 1e6, 1),
               "model_rss_ratio": round((rss - _median(fixed)) / (model_bytes + prefix_bytes), 2),
               "torch_in_process": bool(runs[0]["heavy_imports"])}
        if plain:  # what the session cache saves: the same runs with it off
            out["cold_start_ms_no_session_cache"] = _median(r["cold_start_ms"] for r in plain)
            out["peak_rss_mb_no_session_cache"] = round(_median(r["peak_rss_bytes"] for r in plain) / 1e6, 1)
        self.log(f"  {backend} cold start {out['cold_start_ms']:.0f} ms, peak RSS {out['peak_rss_mb']} MB "
                 f"({out['rss_ratio']}x model+prefix; {out['fixed_rss_mb']} MB without a model, the rest "
                 f"{out['model_rss_ratio']}x model+prefix)" + (
                     f"; without the session cache {out['cold_start_ms_no_session_cache']:.0f} ms, "
                     f"{out['peak_rss_mb_no_session_cache']} MB" if plain else ""))
        return out


def machine_info(threads: int) -> dict:
    import onnxruntime

    info = {"cpu_count": os.cpu_count(), "threads": threads, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__}
    try:
        import llama_cpp

        info["llama_cpp_python"] = llama_cpp.__version__
    except ImportError:
        pass
    return info


def run_bench(bundle: Path, backends: list[str], lengths: list[int], n_input: int, threads: int,
              runs: int, peers: bool = True, log=print) -> dict:
    b = Bench(bundle, threads, runs, log)
    report = {"bundle": str(bundle), "machine": machine_info(threads), "runs": runs,
              "ttft": [], "task_switch": [], "decode": [], "restore": [], "cold_start": []}
    limit = b.manifest.model.n_ctx - n_input - 16  # positions the model can address
    if any(P > limit for P in lengths):
        log(f"  prefix lengths above {limit} skipped: the model's context is {b.manifest.model.n_ctx}")
        lengths = [P for P in lengths if P <= limit]
    switch_p = min(1024, limit)
    n_ctx = max(lengths + [switch_p]) + n_input + 16
    for name in backends:
        if name not in b.manifest.backends:
            raise PrefixEdgeError(f"bundle {bundle} has no {name} model")
        log(f"[{name}]")
        ctx = n_ctx
        be, loop = b.open(name, ctx), None
        try:
            report["ttft"] += b.ttft(be, lengths, n_input)
            report["task_switch"].append(b.task_switch(be, switch_p))
            if peers and name == "gguf":  # the plain llama-cpp-python loop, rounds interleaved
                loop = b.peer_loop("llama_cpp_loop.py", b.model_file("gguf"), threads, 64, 128 + 8, ctx)
            dec = b.decode(be, peer=loop if isinstance(loop, PeerLoop) else None)
            if isinstance(loop, dict):
                dec["baseline"], dec["ratio"] = loop, None
        finally:
            be.close()
            if isinstance(loop, PeerLoop):
                loop.close()
        if peers:
            if name == "onnx":
                dec["baseline"] = b.peer("optimum_generate.py", bundle, threads, 64, 128 + 8)
                base = (dec["baseline"] or {}).get("tok_s")
                dec["ratio"] = round(dec["tok_s"] / base, 3) if base else None
                dec["genai"] = b.genai_peer(threads, 64, 128 + 8)
                g = dec["genai"].get("tok_s")
                dec["genai_ratio"] = round(dec["tok_s"] / g, 3) if g else None
        log(f"  {name} decode {dec['tok_s']:.1f} tok/s" +
            (f" vs baseline {dec['baseline'].get('tok_s')} ({dec.get('ratio')}x)" if dec.get("baseline") else ""))
        report["decode"].append(dec)
        report["restore"].append(b.restore_from_file(name, switch_p, ctx))
        report["cold_start"].append(b.cold_start(name))
    return report
