"""Prefixes past the sliding window, on both engines (a tiny seeded Gemma 3: 5 sliding layers of
window 8 : 1 global, converted by llama.cpp's converter to an f32 GGUF):
- raw text prefixes of 0.5x, 1x, 2x and 4x the window, and one longer than llama.cpp's whole
  sliding-window cache (window + a batch: its ring wraps, so the state llama.cpp writes holds
  the window's cells out of position order), bake; each task's first-step logits equal
  prefilling its prefix in one sequence (ONNX to 1e-5; llama.cpp bit for bit, past its old ring
  too: a restored window's cells sit where a prefill leaves them), and its greedy reply equals
  the prefilled run's;
- on GGUF the reply equals plain llama-cpp-python's greedy run of the same ids;
- a prompt past the ring, cached, then continued (a conversation's next turn) answers as
  the cold run."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime

from .helpers.archs import build_arch
from .helpers.parity import baked_and_prefilled

pytestmark = pytest.mark.integration

WINDOW = 8
RING = 520  # llama.cpp's sliding-window cache: window + one batch of 512
N = 8
WORDS = ("apple river stone cloud seven green market window quiet bright silver paper garden "
         "yellow table music forest candle").split()


def _text(rng, n_words: int) -> str:
    return " ".join(rng.choice(WORDS, n_words))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("swa-long")
    built = build_arch("gemma3", root / "model", convert=False, max_position_embeddings=4096)
    tok = built.tokenizer
    rng = np.random.default_rng(7)
    sizes = {"half": WINDOW // 2, "one": WINDOW, "two": 2 * WINDOW, "four": 4 * WINDOW, "ring": 2 * RING}
    prefixes = {}
    for name, target in sizes.items():
        words = max(1, target // 2)
        while True:  # grow the text until it is at least `target` tokens
            text = _text(rng, words)
            n = len(tok.encode(text, add_special_tokens=False))
            if n >= target:
                break
            words += max(1, (target - n) // 2)
        prefixes[name] = text
    tasks = "".join(f'[task.{name}]\nchat = false\nprefix = "{text} "\ntemplate = "{{input}} :"\n'
                    f"max_tokens = {N}\n\n" for name, text in prefixes.items())
    (root / "tasks.toml").write_text(tasks, encoding="utf-8")
    manifest = export_bundle(built.hf_dir, root / "tasks.toml", root / "bundle", formats=("onnx", "gguf"),
                             quantize="none", gguf_quant="f32", progress=False)
    return root / "bundle", manifest, sizes


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_prefixes_past_the_window_are_the_prefill(bundle, backend):
    path, manifest, sizes = bundle
    assert manifest.tasks["ring"].prefix_tokens > RING + 256  # past the ring, rounded to 256
    diffs = {}
    with Runtime.open(path, backend=backend) as rt:
        for task, target in sizes.items():
            assert manifest.tasks[task].prefix_tokens >= target
            for text in ("silver river", "quiet garden market"):
                baked, full = baked_and_prefilled(rt, task, text)
                diffs[task] = max(diffs.get(task, 0.0), float(np.max(np.abs(baked - full))))
                a = rt.generate(task, text, max_tokens=N)
                b = rt.generate(task, text, max_tokens=N, use_prefix_cache=False)
                assert a.tokens == b.tokens and len(a.tokens) > 0, (backend, task, text)
    print(f"\n{backend}: max |baked - prefilled| first-step logits per task {diffs}")
    for task, d in diffs.items():
        # llama.cpp bit for bit at every length: the restored window's cells sit at the cells a
        # prefill leaves them in (seqstate_write.unfold_window; before, past the ring, ~1e-3)
        bound = 1e-5 if backend == "onnx" else 0.0
        assert d <= bound, (backend, task, d)


def test_gguf_equals_plain_llama_cpp(bundle):
    from llama_cpp import Llama

    path, manifest, sizes = bundle
    gguf = path / "gguf" / "model.gguf"
    plain = Llama(str(gguf), n_ctx=4096, n_batch=512, verbose=False, seed=0)
    with Runtime.open(path, backend="gguf") as rt:
        for task in sizes:
            prefix, _ = rt.prefixes.get(task)
            ids = [int(t) for t in prefix.ids] + [int(t) for t in rt.encode_input(task, "silver river")]
            ours = rt.generate(task, "silver river", max_tokens=N).tokens
            theirs = []
            for t in plain.generate(ids, temp=0.0, top_k=1, reset=True):
                if int(t) in manifest.model.eos_token_ids:
                    break
                theirs.append(int(t))
                if len(theirs) == N:
                    break
            assert ours == theirs, task


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_prompt_cache_past_the_ring(bundle, backend):
    """A prompt past the ring read once; a longer one that starts with it (a conversation's next
    turn) restores it and answers as its cold run."""
    path, _, _ = bundle
    rng = np.random.default_rng(11)
    with Runtime.open(path, backend=backend) as rt:
        first = rt.tokenizer.encode(_text(rng, 700), add_special_tokens=False).ids
        # llama.cpp cannot cut a sliding-window state back, so a hit covers a whole entry: the
        # first prompt ends where the second one's prefill chunks (128 tokens) do
        first = first[:len(first) // 128 * 128]
        more = first + rt.tokenizer.encode(" " + _text(rng, 40), add_special_tokens=False).ids
        assert len(first) > RING + 256
        rt.generate(None, first, max_tokens=N)
        hit = rt.generate(None, more, max_tokens=N)
        cold = rt.generate(None, more, max_tokens=N, use_prompt_cache=False)
        assert hit.stats.cached_from["prompt_cache"] == len(first), hit.stats
        assert cold.stats.cached_tokens == 0
        assert hit.tokens == cold.tokens and hit.tokens


def test_window_cache_window_is_llama_cpps_ring(bundle):
    """window_cache="window" (the opt-in for less memory) keeps llama.cpp's ring of the window
    and a batch: past it, a sequence's earliest kept position moves on (the "full" default keeps
    position 0's cells); the task past the ring still bakes and answers; a bad value is one line."""
    from prefix_edge.errors import PrefixEdgeError

    path, _, _ = bundle
    first = {}
    for mode in ("full", "window"):
        with Runtime.open(path, backend="gguf", window_cache=mode) as rt:
            be = rt.backend
            be.begin(None)
            be.prefill(np.arange(2 * RING) % 200 + 5)
            first[mode] = int(be._L.llama_memory_seq_pos_min(be.mem, be.single_seq))
            assert len(rt.generate("ring", "silver river", max_tokens=N).tokens) > 0
    assert first == {"full": 0, "window": first["window"]} and first["window"] > 0, first
    with pytest.raises(PrefixEdgeError, match="window_cache must be 'full' or 'window', got 'ring'"):
        Runtime.open(path, backend="gguf", window_cache="ring")
