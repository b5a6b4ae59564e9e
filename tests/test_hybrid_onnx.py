"""Hybrids on the own ONNX graph (export/onnx_hybrid.py): LFM2 (short-convolution layers beside
attention layers), Granite 4.0-H (Mamba2 layers beside attention layers without RoPE) and
Falcon-H1 (a Mamba2 mixer beside attention in every layer, its μP multipliers set), each a
tiny seeded checkpoint (tests/helpers/families.py) with a chat, a text and a PEFT prompt-tuning
task, exported once with `--format onnx,gguf --quantize none --gguf-quant f32`:
- the graph carries each recurrent layer's states in and out (a conv window; Mamba2's SSM state
  too); the engine's state layout says so (three recurrent layers, no cutting back), and a
  prefix file holds the states beside the KV; a Mamba2 graph's long prefill runs in pieces;
- fp32 logits match transformers at every position, stepped, chunked and whole
  (tests/test_families_onnx.py runs the same checks on it), and so do pooled hidden states;
- the baked prompt-tuning task gives PEFT's own logits on both engines; a prefix-tuning adapter
  is refused in one line (a recurrent layer has no KV to set);
- a snapshot restored over another state continues exactly; a conversation's next turn, and
  the same documents with a new question, come from the prompt cache and equal the uncached run; speculative decoding falls back to one token per
  forward with the same answer; a malformed state in a prefix file is one line."""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.errors import PrefixEdgeError

from .helpers.adapters import make_adapter
from .helpers.families import FALCON_MUP, build_family
from .helpers.parity import baked_and_prefilled

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")

N = 8
TASKS = f'''
[task.support]
system = "You are a helpful assistant. Answer briefly and politely, and mention the plan."
max_tokens = {N}

[task.raw]
kind = "text"
prefix = "The quick brown fox jumps over the lazy dog. "
template = "{{input}} =>"
max_tokens = {N}

[task.soft]
kind = "peft"
adapter = "prompt"
chat = false
max_tokens = {N}
'''
INPUTS = ["The quick brown fox", "def add(a, b):\n    return", "I'm sure they'll say"]
SYSTEM = ("Answer from this document. The Orion desk lamp ships from Porto in three days; its "
          "warranty is two years and the shade is aluminium.")
# kind -> its states (LFM2's and Granite 4.0-H's layers: recurrent, recurrent, attention,
# recurrent; Falcon-H1's two layers: both), its attention layers and config overrides
STATES = {
    "lfm2": {f"past_conv.{i}": (1, 64, 2) for i in (0, 1, 3)},
    "granitehybrid": {n: s for i in (0, 1, 3) for n, s in ((f"past_conv.{i}", (1, 160, 3)),
                                                             (f"past_ssm.{i}", (1, 4, 32, 16)))},
    "falconh1": {n: s for i in (0, 1) for n, s in ((f"past_conv.{i}", (1, 96, 3)),
                                                     (f"past_ssm.{i}", (1, 4, 16, 16)))},
    # Nemotron-H: Mamba2 at 0, attention at 2, MLP-only layers (1, 3) hold no state at all
    "nemotronh": {"past_conv.0": (1, 160, 3), "past_ssm.0": (1, 8, 16, 16)},
    # Qwen3.5: three Gated DeltaNet layers (conv over q, k, v: 2*2*16 + 4*16; S [4 heads, 16, 16])
    "qwen3_5": {n: s for i in (0, 1, 2) for n, s in ((f"past_conv.{i}", (1, 128, 3)),
                                                       (f"past_ssm.{i}", (1, 4, 16, 16)))},
}
ATTENTION = {"lfm2": [2], "granitehybrid": [2], "falconh1": [0, 1], "nemotronh": [2], "qwen3_5": [3]}
# (the embedding multiplier left at 1: PEFT's inputs_embeds skip it; test_falcon_h1_prompt_tuning...)
OVERRIDES = {"falconh1": dict(FALCON_MUP, embedding_multiplier=1.0)}


@pytest.fixture(scope="module", params=list(STATES))
def hybrid(request, tmp_path_factory):
    """(model, tokenizer, root, kind): the checkpoint, its prompt-tuning adapter and the bundle,
    exported by the default command's formats."""
    import os
    import subprocess
    import sys

    kind = request.param
    root = tmp_path_factory.mktemp(f"{kind}-onnx")
    model, tok = build_family(kind, root / "model", **OVERRIDES.get(kind, {}))
    make_adapter(root / "model", "prompt", root / "prompt", seed=3)
    (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "prefix_edge", "export", str(root / "model"), "--tasks",
                        str(root / "tasks.toml"), "--format", "onnx,gguf", "--quantize", "none",
                        "--gguf-quant", "f32", "--out", str(root / "bundle")], capture_output=True, text=True, cwd=root,
                       env={**os.environ, "PREFIX_EDGE_HOME": str(root / "home")})
    assert p.returncode == 0, p.stderr[-2000:]
    return model, tok, root, kind


def test_state_layout_and_prefix_file(hybrid):
    from prefix_edge.bundle import prefixfile

    _, _, root, kind = hybrid
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        assert dict(zip(be.state_names, be.state_shapes)) == STATES[kind]
        assert be.past_names == [f"past_key_values.{i}.{t}" for i in ATTENTION[kind] for t in ("key", "value")]
        assert be.piece == (None if kind == "lfm2" else 256)
        lay = be.state_layout
        assert (lay.kv_layers, lay.recurrent_layers) == (len(ATTENTION[kind]), len({n.split(".")[1] for n in STATES[kind]}))
        assert (be.keeps_partial, rt.prompts.partial, be.model_layers) == (False, False, 2 if kind == "falconh1" else 4)
        tensors, _ = prefixfile.read(root / "bundle" / "tasks" / "raw.onnx.safetensors")
        prefix, _ = rt.prefixes.get("raw")
        for i, name in enumerate(be.state_names):
            state = tensors[name]
            assert state.shape == STATES[kind][name] and state.dtype == np.float32 and np.abs(state).max() > 0
            np.testing.assert_array_equal(prefix.state.states[i], state)
        assert tensors[be.past_names[0]].shape == (1, 2, prefix.n_tokens, 64 if kind == "qwen3_5" else 16)


def test_pooled_hidden_states_match_transformers(hybrid):
    import torch

    model, tok, root, kind = hybrid
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        # the last: longer than a piece of the embedder's runs (embedding.PIECE), so the
        # recurrent states are carried from piece to piece
        for text in [*INPUTS, " ".join(INPUTS) * 12]:
            ids = tok.encode(text, add_special_tokens=False)
            got = rt.embed([ids], pooling="mean", normalize=False)[0]
            with torch.no_grad():
                want = model.model(torch.tensor([ids])).last_hidden_state[0].mean(0).numpy()
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4, err_msg=text)


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_baked_prompt_tuning_is_peft(hybrid, backend):
    """PEFT's prompt tuning on LFM2 (virtual tokens through the conv layers too): the baked
    task's first-step logits are PEFT's own (ONNX fp32 to 1e-4; llama.cpp with f32 weights and
    its F16 KV cache within 1e-2, measured 8e-4), the same greedy token."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, tok, root, kind = hybrid
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(root / "model")).eval(),
                                   str(root / "prompt")).eval()
    with Runtime.open(root / "bundle", backend=backend) as rt:
        prefix, _ = rt.prefixes.get("soft")
        assert prefix.n_virtual == 4
        for text in INPUTS:
            ids = tok.encode(text, add_special_tokens=False)
            with torch.no_grad():
                cur = torch.tensor([ids])
                want = pm(input_ids=cur, attention_mask=torch.ones_like(cur)).logits[0, -1].numpy()
            rt.backend.begin(prefix)
            got = rt.backend.prefill(np.array(ids, np.int64))
            assert np.abs(got - want).max() <= (1e-4 if backend == "onnx" else 1e-2), (backend, text)
            assert got.argmax() == want.argmax(), (backend, text)


def test_prefix_tuning_is_refused_in_one_line(hybrid, tmp_path):
    from prefix_edge.export.build import export_bundle

    _, _, root, kind = hybrid
    make_adapter(root / "model", "prefix", tmp_path / "prefix", seed=4)
    (tmp_path / "tasks.toml").write_text('[task.tuned]\nkind = "peft"\nadapter = "prefix"\nchat = false\n',
                                         encoding="utf-8")
    n = len({n.split(".")[1] for n in STATES[kind]})
    with pytest.raises(PrefixEdgeError, match=f"{n} recurrent layers keep a state, not a KV") as e:
        export_bundle(root / "model", tmp_path / "tasks.toml", tmp_path / "bundle", formats=("onnx",),
                      quantize="none", progress=False)
    assert "\n" not in str(e.value)


def test_baked_prefixes_and_restore(hybrid):
    """baked == prefilled on both engines; on ONNX a snapshot restored over another sequence's
    state continues exactly, and cannot be cut to its first positions."""
    _, _, root, kind = hybrid
    for backend in ("onnx", "gguf"):
        with Runtime.open(root / "bundle", backend=backend) as rt:
            for task in ("support", "raw"):
                for text in INPUTS:
                    baked, full = baked_and_prefilled(rt, task, text)
                    assert np.max(np.abs(baked - full)) < 1e-5, (backend, task, text)
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        prefix, _ = rt.prefixes.get("raw")
        ids = rt.encode_input("raw", INPUTS[0])
        be.begin(prefix)
        be.prefill(ids)
        n = be.seq_pos(be.single_seq)
        snap = be.seq_snapshot(be.single_seq, np.concatenate([prefix.ids, ids]))
        want = be.step(7)
        be.begin(None)
        be.prefill(rt.encode_input("raw", INPUTS[1]))  # another state in the sequence's place
        assert be.seq_restore(be.single_seq, snap) == n
        be.pos = n
        np.testing.assert_array_equal(be.step(7), want)
        with pytest.raises(PrefixEdgeError, match=f"cannot keep 5 of a state's {n} positions"):
            be.seq_restore(be.single_seq, snap, keep=5)
        with pytest.raises(PrefixEdgeError, match="recurrent layers hold only the state after the last token"):
            be.seq_truncate(be.single_seq, n - 1)


def test_next_turn_from_the_prompt_cache_and_speculative_fallback(hybrid):
    _, _, root, kind = hybrid
    with Runtime.open(root / "bundle", backend="onnx", prefill_chunk=16) as rt:
        turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How long is the warranty?"}]
        first = rt.generate(None, messages=turn, max_tokens=6)
        turn += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Where from?"}]
        got = rt.generate(None, messages=turn, max_tokens=6, logprobs=2)
        ref = rt.generate(None, messages=turn, max_tokens=6, logprobs=2, use_prompt_cache=False)
        assert got.tokens == ref.tokens and got.logprobs == ref.logprobs
        assert got.stats.cached_tokens >= first.stats.input_tokens > 0
        for text in INPUTS:  # the state cannot be cut back: one token per forward, the same answer
            a = rt.generate("raw", text, max_tokens=N, speculative="lookup")
            b = rt.generate("raw", text, max_tokens=N)
            assert a.tokens == b.tokens and len(a.tokens) > 0, text


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_the_same_documents_with_a_new_question_come_from_the_cache(hybrid, backend):
    """A recurrent state cannot be cut back, so the cache keeps one more state at the start of a
    prompt's last message: the same system message (documents) with a new question resumes
    there, and answers as the uncached run does (tokens and log-probabilities)."""
    _, _, root, kind = hybrid
    docs = {"role": "system", "content": SYSTEM}  # about 100 tokens (the context is 256)
    with Runtime.open(root / "bundle", backend=backend, prefill_chunk=16) as rt:
        first = rt.generate(None, messages=[docs, {"role": "user", "content": "How long is the warranty?"}],
                            max_tokens=6)
        assert first.stats.cached_tokens == 0
        msgs = [docs, {"role": "user", "content": "Where does it ship from?"}]
        got = rt.generate(None, messages=msgs, max_tokens=6, logprobs=2)
        ref = rt.generate(None, messages=msgs, max_tokens=6, logprobs=2, use_prompt_cache=False)
        assert got.tokens == ref.tokens and got.logprobs == ref.logprobs, (kind, backend)
        assert 64 <= got.stats.cached_tokens < got.stats.input_tokens == ref.stats.input_tokens, \
            (kind, backend, got.stats.cached_tokens, got.stats.input_tokens)


def test_a_malformed_state_is_refused_in_one_line(hybrid):
    from prefix_edge.bundle import prefixfile

    _, _, root, kind = hybrid
    path = root / "bundle" / "tasks" / "raw.onnx.safetensors"
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        tensors, meta = prefixfile.read(path)
        name = be.state_names[1]
        nan = tensors[name].copy()
        nan[0, 3, 1] = np.nan
        cases = {
            "missing": ({k: v for k, v in tensors.items() if k != name}, name),
            "shape": ({**tensors, name: tensors[name][:, :, :1].copy()}, "needs float32\\[1, "),
            "dtype": ({**tensors, name: tensors[name].astype(np.float16)}, "needs float32"),
            "NaN": ({**tensors, name: nan}, "NaN or infinite"),
        }
        for what, (bad, message) in cases.items():
            with pytest.raises(PrefixEdgeError, match=message) as e:
                be.prefix_from(bad, meta, str(path))
            assert "\n" not in str(e.value), what
        assert len(rt.generate("raw", INPUTS[0], max_tokens=4).tokens) > 0


def test_a_long_prefill_in_pieces_is_the_whole_run(hybrid):
    """A Mamba2 graph's forward of more than SSM_CHUNK tokens runs in pieces (its closed form
    holds [heads, n, n] terms): 200 tokens give transformers' logits whole and in pieces of 7
    (the tiny model's context is 256 positions)."""
    import torch

    model, tok, root, kind = hybrid
    ids = np.random.default_rng(1).integers(0, len(tok), 200)
    with torch.no_grad():
        want = model(torch.tensor(ids[None])).logits[0, -1].numpy()
    with Runtime.open(root / "bundle", backend="onnx") as rt:
        be = rt.backend
        for piece in ([be.piece, 7] if be.piece else [None]):  # (LFM2's graph: no pieces)
            be.piece = piece
            be.begin(None)
            got = be.prefill(ids)
            assert np.abs(got - want).max() <= 1e-4, (kind, piece)


def test_experts_are_refused_in_one_line(tmp_path):
    """The own graph builds the dense Granite 4.0-H; an MoE variant (num_local_experts > 0) is
    refused before any weight is read (a real one's are many GB; here there are none), naming the
    way out."""
    import json

    from prefix_edge.export.onnx_graph import build_onnx

    cfg = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
           "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_local_experts": 4,
           "num_experts_per_tok": 2, "hidden_act": "silu"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PrefixEdgeError, match=r"no experts \(num_local_experts 4\).*--format gguf") as e:
        build_onnx(tmp_path, tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out" / "model.onnx").exists()
