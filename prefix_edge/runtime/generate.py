"""Runtime: open a bundle, look up a task, load its prefix, decode the user's input onward.

The decode loop, sampling, stop strings and streaming live here once, above the Backend seam.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..bundle import Manifest
from ..errors import PrefixEdgeError
from ..tasks import check_generation, fill_template
from .backend import BACKENDS, MODEL_SUFFIX, open_backend
from .prefix_cache import PrefixCache
from .sampling import Sampler
from .text import TextStream
from .verify import file_hashes

AUTO_ORDER = ("gguf", "onnx")  # by measured decode speed on CPU (README, Performance)
DEFAULTS: dict[str, Any] = {"max_tokens": 256, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                            "seed": None, "stop": []}


@dataclass
class Stats:
    prefix_tokens: int
    input_tokens: int
    prefix_load_ms: float
    ttft_ms: float
    decode_tok_s: float
    total_ms: float
    generated_tokens: int = 0
    prefix_cached: bool = True
    finish_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Result:
    text: str
    tokens: list[int]
    stats: Stats


def _importable(backend: str) -> bool:
    import importlib.util

    return importlib.util.find_spec({"onnx": "onnxruntime", "gguf": "llama_cpp"}[backend]) is not None


def _gguf_file(root: Path, manifest: Manifest) -> Path | None:
    files = [f for f in manifest.backends["gguf"].files if f.endswith(MODEL_SUFFIX["gguf"])]
    return (root / files[0]) if files and (root / files[0]).is_file() else None


def _llama_or_onnx(root: Path, manifest: Manifest) -> str:
    """auto: gguf if llama.cpp runs on this machine (probed once per build), else onnx."""
    from .probe import llama_verdict, warn

    v = llama_verdict(_gguf_file(root, manifest))
    if v is not None and not v.ok:
        warn(f"{v.detail}; using the onnx backend")
        return "onnx"
    return "gguf"


class Runtime:
    """A bundle opened for generation. Use as a context manager or call close()."""

    def __init__(self, root: Path, manifest: Manifest, backend, tokenizer, fingerprint: str,
                 prefix_cache_size: int):
        self.root, self.manifest, self.backend, self.tokenizer = root, manifest, backend, tokenizer
        self.prefixes = PrefixCache(root, manifest, backend, fingerprint, prefix_cache_size)
        self.n_ctx = backend.n_ctx
        self.eos = set(manifest.model.eos_token_ids)

    @classmethod
    def open(cls, path: str | Path | None = None, backend: str = "auto", device: str = "cpu",
             threads: int | None = None, prefix_cache_size: int = 4,
             n_ctx: int | None = None, verify: str = "cached") -> "Runtime":
        """Open a bundle. backend: "onnx", "gguf" or "auto" (the faster one the bundle has:
        gguf, then onnx). n_ctx caps the context (default: the model's, at most 4096 for
        gguf, whose KV cache is allocated up front). verify: "cached" reuses a model file's
        hash while its stat identity is unchanged (runtime/verify.py); "full" always hashes."""
        from tokenizers import Tokenizer

        from ..paths import default_bundle

        root = Path(path) if path is not None else default_bundle()
        if path is None and not (root / "manifest.json").is_file():
            raise PrefixEdgeError(
                f"no default bundle at {root}; create it with: prefix-edge export")
        manifest = Manifest.read(root)
        if backend == "auto":
            backend = next((b for b in AUTO_ORDER if b in manifest.backends and _importable(b)),
                           next(iter(manifest.backends), "onnx"))
            if backend == "gguf" and "onnx" in manifest.backends and _importable("onnx"):
                backend = _llama_or_onnx(root, manifest)
        if backend == "gguf" and "gguf" in manifest.backends:
            from .probe import require_llama

            require_llama(_gguf_file(root, manifest))  # a crashing build is an error, not a crash
        if backend not in BACKENDS:
            raise PrefixEdgeError(f"unknown backend {backend!r}; choose one of: auto, {', '.join(BACKENDS)}")
        if backend not in manifest.backends:
            raise PrefixEdgeError(f"bundle {root} has no {backend} model (it has: "
                                  f"{', '.join(manifest.backends) or 'none'})")
        info = manifest.backends[backend]
        actual = file_hashes(root, info.files, verify)
        for rel, sha in actual.items():
            if sha != info.files[rel]:
                raise PrefixEdgeError(f"bundle {root}: model file {rel} does not match its manifest "
                                      "entry (changed after export); re-export the bundle")
        tok_hash = file_hashes(root, [manifest.tokenizer.file], verify)[manifest.tokenizer.file]
        if tok_hash != manifest.tokenizer.sha256:
            raise PrefixEdgeError(f"bundle {root}: {manifest.tokenizer.file} does not match the manifest")
        fingerprint = manifest.fingerprint(backend, actual)
        if fingerprint != info.fingerprint:
            raise PrefixEdgeError(
                f"bundle {root}: the manifest's {backend} fingerprint does not match its contents "
                "(the manifest was edited or the bundle is mixed); re-export the bundle")
        ctx = manifest.model.n_ctx if backend == "onnx" else min(manifest.model.n_ctx, 4096)
        ctx = min(ctx, n_ctx) if n_ctx else ctx
        model_file = next(f for f in info.files if f.endswith(MODEL_SUFFIX[backend]))
        be = open_backend(backend, root / model_file, device=device, threads=threads, n_ctx=ctx)
        if be.state_info() != info.state:
            be.close()
            raise PrefixEdgeError(
                f"bundle {root}: its {backend} prefixes were baked for KV state {info.state}, this "
                f"runtime restores {be.state_info()} (another llama.cpp version?); re-export the bundle")
        tokenizer = Tokenizer.from_file(str(root / manifest.tokenizer.file))
        return cls(root, manifest, be, tokenizer, fingerprint, prefix_cache_size)

    # -- API ------------------------------------------------------------------------------
    @property
    def tasks(self) -> dict:
        return dict(self.manifest.tasks)

    def generate(self, task: str, text: str, **overrides) -> Result:
        gen = self._run(task, text, **overrides)
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            return stop.value

    def stream(self, task: str, text: str, **overrides) -> Iterator[str]:
        """Yield text chunks as they are generated. The final Result is in `self.last_result`."""
        self.last_result = yield from self._run(task, text, **overrides)

    def close(self) -> None:
        self.prefixes.clear()
        self.backend.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the loop -------------------------------------------------------------------------
    def options(self, task: str, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = set(overrides) - set(DEFAULTS) - {"use_prefix_cache"}
        if unknown:
            raise PrefixEdgeError(f"unknown generation option {sorted(unknown)[0]!r}")
        opts = {**DEFAULTS, **self.manifest.tasks[task].defaults,
                **{k: v for k, v in overrides.items() if v is not None}}
        check_generation(opts)
        return opts

    def encode_input(self, task: str, text: str) -> np.ndarray:
        info = self.manifest.tasks[task]
        wrapped = info.input_before + fill_template(info.template, text) + info.input_after
        return np.array(self.tokenizer.encode(wrapped, add_special_tokens=False).ids, np.int64)

    def _run(self, task: str, text: str, **overrides):
        t0 = time.perf_counter()
        if task not in self.manifest.tasks:
            raise PrefixEdgeError(f"unknown task {task!r}; this bundle has: "
                                  f"{', '.join(sorted(self.manifest.tasks)) or 'no tasks'}")
        use_cache = overrides.pop("use_prefix_cache", True)
        opts = self.options(task, overrides)
        ids = self.encode_input(task, text)
        P = self.manifest.tasks[task].prefix_tokens
        if len(ids) == 0:
            raise PrefixEdgeError("the input is empty: nothing to generate from")
        room = self.n_ctx - P - len(ids)
        if room < 1:
            raise PrefixEdgeError(
                f"input is {len(ids)} tokens; with task '{task}''s prefix of {P} tokens that exceeds "
                f"the model's context of {self.n_ctx} tokens")
        max_tokens = min(opts["max_tokens"], room)

        if use_cache:
            t = time.perf_counter()
            prefix, _ = self.prefixes.get(task)
            load_ms = (time.perf_counter() - t) * 1e3
            self.backend.begin(prefix)
            logits = self.backend.prefill(ids)
        else:
            load_ms = 0.0
            self.backend.begin(None)
            logits = self.backend.prefill(np.concatenate([self.prefixes.ids(task), ids]))

        sampler = Sampler(opts["temperature"], opts["top_k"], opts["top_p"], opts["seed"])
        stream = TextStream(self.tokenizer, list(opts["stop"]))
        tokens: list[int] = []
        chunks: list[str] = []
        t_first = t_last = None
        finish = "length"
        n_samples = 0
        for i in range(max_tokens):
            tok = sampler(logits)
            n_samples += 1
            t_last = time.perf_counter()
            if t_first is None:
                t_first = t_last
            if tok in self.eos:
                finish = "eos"
                break
            tokens.append(tok)
            chunk = stream.push(tok)
            if chunk:
                chunks.append(chunk)
                yield chunk
            if stream.stopped:
                finish = "stop"
                break
            if i + 1 < max_tokens:
                logits = self.backend.step(tok)
        tail = stream.flush()
        if tail:
            chunks.append(tail)
            yield tail
        end = time.perf_counter()
        n_dec = n_samples - 1  # decode steps between the first and the last sampled token
        dec_s = (t_last - t_first) if t_first is not None else 0.0
        stats = Stats(
            prefix_tokens=P, input_tokens=len(ids), prefix_load_ms=round(load_ms, 3),
            ttft_ms=round(((t_first or end) - t0) * 1e3, 3),
            decode_tok_s=round(n_dec / dec_s, 2) if n_dec > 0 and dec_s > 0 else 0.0,
            total_ms=round((end - t0) * 1e3, 3), generated_tokens=len(tokens),
            prefix_cached=bool(use_cache), finish_reason=finish)
        return Result("".join(chunks), tokens, stats)
