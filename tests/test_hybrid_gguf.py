"""The 2025-26 on-device families on the GGUF engine (tests/helpers/families.py): LFM2,
Granite 4.0-H and Falcon-H1 (hybrids: recurrent layers beside attention), EXAONE 4.0, Hunyuan
dense, OLMo 2 and an all-sliding Gemma 3, each exported once (`--format gguf`, f32 weights
through llama.cpp's own converter) with a chat and a text task:
- the state layout is read off the engine's own state (KV parts, recurrent layers), and a
  hybrid's prompt cache keeps whole states only (keeps_partial is False);
- a baked prefix gives the first-step logits and greedy tokens of prefilling it, and a
  conversation's next turn from the prompt cache equals the uncached run;
- a restore puts back both the KV and the recurrent state; a malformed recurrent state is one
  error line before llama.cpp sees it;
- a model llama.cpp asserts on (a Granite 4.0-H config with num_experts_per_tok left at its
  default) is one error line, not an abort; a model llama.cpp cannot load says why."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from prefix_edge import Runtime
from prefix_edge.errors import PrefixEdgeError
from prefix_edge.runtime.engines.prefix import Prefix
from prefix_edge.runtime.engines.llama.state import SeqBlob
from prefix_edge.llamacpp.seqstate import SEQ_STATE_MAGIC, check_seq_state, parse_seq_state
from prefix_edge.llamacpp.seqstate_write import build_seq_state, in_stream, out_of_stream

from .helpers.families import FAMILIES, build_family
from .helpers.parity import baked_and_prefilled

pytest.importorskip("llama_cpp")

INPUTS = ["The quick brown fox", "def add(a, b):\n    return", "I'm sure they'll say"]
N = 8
TASKS = '''
[task.support]
system = "You are a helpful assistant. Answer briefly and politely, and mention the plan."
max_tokens = 8

[task.raw]
kind = "text"
prefix = "The quick brown fox jumps over the lazy dog. "
template = "{input} =>"
max_tokens = 8
'''
SYSTEM = ("Answer from this document. The Orion desk lamp ships from Porto in three days; its "
          "warranty is two years and the shade is aluminium.")
_EXPORTS: dict = {}


def _exported(kind: str, tmp_path_factory):
    """One export per family for the whole module: (hf_dir, bundle, manifest)."""
    if kind not in _EXPORTS:
        from prefix_edge.export.build import export_bundle

        root = tmp_path_factory.mktemp(f"family-{kind}")
        build_family(kind, root / "model")
        (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
        manifest = export_bundle(root / "model", root / "tasks.toml", root / "bundle", quantize="none",
                                 gguf_quant="f32", formats=["gguf"], progress=False)
        _EXPORTS[kind] = (root / "model", root / "bundle", manifest)
    return _EXPORTS[kind]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    return (request.param, *_exported(request.param, tmp_path_factory))


@pytest.mark.integration
def test_state_layout_and_fidelity(family):
    kind, _, bundle, manifest = family
    # f32 weights, llama.cpp's F16 KV cache: as tests/test_architectures.py
    fid = manifest.extra["fidelity"]["gguf"]
    # (Gemma 4: llama.cpp's gemma4 graph is 0.10-0.15 off transformers with an f32 KV cache too,
    # so the graph's, not the cache's: measured 0.098 here, greedy agreeing)
    bound = 0.2 if kind == "gemma4" else 0.1
    assert fid["max_abs_logit_diff_first_token"] <= bound and fid["first_token_agrees"] == fid["probes"], (kind, fid)
    n_rec = FAMILIES[kind][2]
    with Runtime.open(bundle, backend="gguf") as rt:
        be = rt.backend
        assert be.n_kv_heads == 2 and be.format.recurrent_layers == n_rec, kind  # llama.cpp says 0 KV heads for a recurrent layer 0
        assert be.keeps_partial == (n_rec == 0 and kind not in ("gemma3-sliding", "olmo3", "gemma4")), kind  # a window slid
        lay = be.state_layout  # the protocol's description of the same
        assert lay.recurrent_layers == n_rec and lay.keeps_partial == be.keeps_partial, (kind, lay)
        assert lay.kv_layers + lay.window_layers + lay.recurrent_layers >= 1, (kind, lay)
        if kind == "gemma3-sliding":
            assert (lay.kv_layers, lay.window_layers, lay.window) == (0, 2, 8), lay
        assert rt.prompts.partial == be.keeps_partial
        if kind == "exaone4":  # n_swa 4096 in the model, no sliding-window cache
            assert (be.n_swa, be.format.parts) == (0, 1)
        if kind == "gemma3-sliding":  # every layer in the window's cache, none in the full one
            assert (be.format.parts, be.format.layout.kv_layers, be.format.layout.swa_n_layer) == (2, 0, 2)
        if kind == "olmo3":  # three sliding layers of 8 positions and a global one
            assert (be.format.parts, be.format.layout.kv_layers, be.format.layout.swa_n_layer, be.n_swa) == (2, 1, 3, 8)
        if kind == "gemma4":  # 3 sliding layers with heads of 16, 1 global of 512; the 2 KV-shared hold none
            assert (be.format.parts, be.format.layout.kv_layers, be.format.layout.swa_n_layer) == (2, 1, 3)
            assert (be.head_dim, be.head_dim_swa, be.n_swa) == (512, 16, 8)
        # Qwen3.5's M-RoPE: its cells carry more than a position (read off the probe)
        assert be.format.layout.cell_ext == (12 if kind == "qwen3_5" else 0), kind


@pytest.mark.integration
def test_baked_prefix_is_the_prefill(family):
    kind, _, bundle, _ = family
    with Runtime.open(bundle, backend="gguf") as rt:
        for task in ("support", "raw"):
            for text in INPUTS:
                baked, full = baked_and_prefilled(rt, task, text)
                assert np.max(np.abs(baked - full)) < 1e-5, (kind, task, text)
                a = rt.generate(task, text, max_tokens=N)
                b = rt.generate(task, text, max_tokens=N, use_prefix_cache=False)
                assert a.tokens == b.tokens and len(a.tokens) > 0, (kind, task, text)


@pytest.mark.integration
@pytest.mark.parametrize("read_ahead", [False, True])
def test_next_turn_from_the_prompt_cache_is_the_uncached_run(family, read_ahead):
    """A conversation's second turn starts with the first turn's prompt: its state comes from
    the prompt cache (a hybrid's whole entry: its recurrent state cannot be cut back) or, once
    the first reply has been read ahead, from the state at that reply's end; either way the
    answer equals the same request with the cache off, logprobs bit for bit. Over several
    lengths, so the cached state ends at cells of every alignment (a sliding-window model's
    restored cells once sat elsewhere than a prefill's, and its sums then differed in the last
    bits at 6 of 12 lengths)."""
    kind, _, bundle, _ = family
    with Runtime.open(bundle, backend="gguf", prefill_chunk=16, read_ahead=read_ahead) as rt:
        for k in range(5):
            turn = [{"role": "system", "content": SYSTEM + " Also" * k},
                    {"role": "user", "content": "How long is the warranty?"}]
            assert rt.read_ahead.settle(60)  # the previous k's replies read (or skipped)
            done = rt.read_ahead.done
            first = rt.generate(None, messages=turn, max_tokens=6)
            if read_ahead:  # the reply read ahead before the next turn comes (as a reading user gives it time)
                assert rt.read_ahead.settle(60) and rt.read_ahead.done == done + 1, (kind, rt.read_ahead.info())
            turn += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Where from?"}]
            got = rt.generate(None, messages=turn, max_tokens=6, logprobs=2)
            ref = rt.generate(None, messages=turn, max_tokens=6, logprobs=2, use_prompt_cache=False)
            assert got.tokens == ref.tokens and got.logprobs == ref.logprobs, (kind, k)
            assert got.stats.input_tokens == ref.stats.input_tokens
            if read_ahead:  # the hit at the reply's end: only the new message prefilled
                assert got.stats.cached_tokens > first.stats.input_tokens, (kind, k, got.stats)
            else:
                assert got.stats.cached_tokens >= first.stats.input_tokens > 0, (kind, k)


@pytest.mark.integration
def test_restore_puts_back_kv_and_recurrent_state(family):
    """A snapshot restored over another sequence's state continues exactly as the sequence it
    was taken from; a hybrid's snapshot holds its recurrent state at the last position, and
    cannot be cut to its first positions."""
    kind, _, bundle, _ = family
    with Runtime.open(bundle, backend="gguf") as rt:
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
        np.testing.assert_array_equal(be.step(7), want, err_msg=kind)
        info = be.format.parse(snap.state.blob)
        check_seq_state(info, be.format.expected(n))
        if FAMILIES[kind][2]:
            assert info.recurrent.cell_count == 1 and int(info.recurrent.positions[0]) == n - 1
            with pytest.raises(PrefixEdgeError, match=f"cannot keep 5 of a state's {n} positions"):
                be.seq_restore(be.single_seq, snap, keep=5)


@pytest.mark.integration
def test_a_malformed_recurrent_state_is_refused_in_one_line(tmp_path_factory):
    """Each refused before llama.cpp reads it, with what is wrong."""
    _, bundle, _ = _exported("granitehybrid", tmp_path_factory)
    with Runtime.open(bundle, backend="gguf") as rt:
        be = rt.backend
        prefix, _ = rt.prefixes.get("raw")
        blob = prefix.state.blob.tobytes()
        info = be.format.parse(blob)
        rec = info.recurrent
        start, end = rec.span
        pos_at = start + 4
        nan_at = rec.layers[0].s_offset
        last = prefix.n_tokens - 1
        cases = {
            "truncated": (blob[:-6], "truncated"),
            "no recurrent state": (blob[:start], "ends where the recurrent layers' state should begin"),
            "other position": (blob[:pos_at] + struct.pack("<i", 3) + blob[pos_at + 4:],
                               f"recurrent state position is 3, expected {last}"),
            "a named sequence": (blob[:pos_at + 4] + struct.pack("<I", 1) + blob[pos_at + 8:],
                                 "recurrent cell names 1 sequences"),
            "NaN": (blob[:nan_at] + np.float32("nan").tobytes() + blob[nan_at + 4:], "NaN or infinite"),
            "another model": (blob[:start + 16] + struct.pack("<I", 6) + blob[start + 20:], "trailing bytes|n_layer"),
        }
        for name, (bad, message) in cases.items():
            p = Prefix(prefix.ids, SeqBlob(np.frombuffer(bad, np.uint8).copy()))
            with pytest.raises(PrefixEdgeError, match=message):
                be.seq_restore(1, p)
            assert be.seq_pos(1) == 0, name  # nothing reached llama.cpp's cache
        assert len(rt.generate("raw", INPUTS[0], max_tokens=4).tokens) > 0


@pytest.mark.integration
def test_a_model_llama_cpp_asserts_on_is_one_error_line(tmp_path):
    """num_experts_per_tok left at its default beside num_local_experts = 0: llama.cpp's
    GGML_ASSERT(n_expert_used_max <= n_expert) aborts its process; here quantizing and the first
    load run in a child, and the abort is an error line naming the model."""
    from prefix_edge.export.gguf import convert_hf_to_gguf
    from prefix_edge.llamacpp.quantize import quantize_gguf

    build_family("granitehybrid", tmp_path / "model", num_experts_per_tok=2)
    f32 = tmp_path / "model-f32.gguf"
    with pytest.raises(PrefixEdgeError, match=r"aborted \(SIGABRT\) loading model converted to GGUF: "
                                              r"GGML_ASSERT\(n_expert_used_max <= hparams.n_expert\) failed"):
        convert_hf_to_gguf(tmp_path / "model", f32, "f32")
    assert not f32.exists()
    convert_hf_to_gguf(tmp_path / "model", f32, "f32", check=False)
    with pytest.raises(PrefixEdgeError, match=r"aborted \(SIGABRT\) quantizing .*model-f32.gguf "
                                              r"\(granitehybrid, .*\) to q8_0: GGML_ASSERT\(n_expert_used_max"):
        quantize_gguf(f32, tmp_path / "q8.gguf", "q8_0")
    assert not (tmp_path / "q8.gguf").exists()


@pytest.mark.integration
def test_a_model_llama_cpp_cannot_load_says_why(tmp_path_factory, tmp_path):
    from prefix_edge.runtime.engines.llama.engine import LlamaBackend

    _, bundle, _ = _exported("olmo2", tmp_path_factory)
    data = bytearray((bundle / "gguf" / "model.gguf").read_bytes())
    at = data.index(b"tokenizer.ggml.pre") + len(b"tokenizer.ggml.pre")
    _, n = struct.unpack_from("<IQ", data, at)
    data[at + 12:at + 12 + n] = b"z" * n  # a pre-tokenizer llama.cpp does not know
    (tmp_path / "vocab.gguf").write_bytes(bytes(data))
    with pytest.raises(PrefixEdgeError, match="vocab.gguf: llama.cpp says: error loading model vocabulary: "
                                              "unknown pre-tokenizer type: 'z+'"):
        LlamaBackend(tmp_path / "vocab.gguf")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(PrefixEdgeError, match="not a GGUF file"):
        LlamaBackend(tmp_path / "text.gguf")


# -- the blob layout, no engine ----------------------------------------------------------------

def _hybrid_blob(p: int = 5, n_layer: int = 4, n_rec: int = 3, r_row: int = 512, s_row: int = 0) -> bytes:
    """A KV part of one attention layer, then a recurrent part as llama_memory_hybrid writes it."""
    rng = np.random.default_rng(0)
    kv = build_seq_state([rng.normal(size=(p, 32)).astype(np.float16)],
                         [rng.normal(size=(p, 32)).astype(np.float16)], v_trans=True)
    rec = [struct.pack("<IiIII", 1, p - 1, 0, 0, n_layer)]
    for row in [r_row] * n_rec + [s_row] * n_rec:
        rec += [struct.pack("<iQ", 0, row), rng.normal(size=row // 4).astype("<f4").tobytes()]
    return kv + b"".join(rec)


def test_a_hybrid_blob_parses_and_travels_through_streams():
    blob = _hybrid_blob()
    assert struct.unpack_from("<I", blob)[0] == SEQ_STATE_MAGIC
    found = parse_seq_state(blob, recurrent=None)  # the engine's first read: as many as it holds
    assert len(found.recurrent.layers) == 3 and found.recurrent.facts()["r_row_bytes"] == 512
    info = parse_seq_state(blob, recurrent=3)
    check_seq_state(info, {"n_layer": 1, "cell_count": 5, "recurrent": found.recurrent.facts()})
    laid = in_stream(np.frombuffer(blob, np.uint8), 2, 4, info)
    assert laid.nbytes == len(blob) + 4 * 3  # three empty KV streams; the recurrent part as it is
    assert out_of_stream(laid.copy(), 2, 4, 1, 3).tobytes() == blob
    with pytest.raises(PrefixEdgeError, match="trailing bytes"):
        parse_seq_state(blob)  # read as a KV-only blob
    with pytest.raises(PrefixEdgeError, match="recurrent state n_layer is 0|trailing|truncated"):
        parse_seq_state(blob, recurrent=4)
    other = parse_seq_state(_hybrid_blob(r_row=256), recurrent=3)
    with pytest.raises(PrefixEdgeError, match="recurrent layer 0 r_row_bytes is 256, expected 512"):
        check_seq_state(other, {"cell_count": 5, "recurrent": found.recurrent.facts()})


def test_an_all_sliding_blob_has_a_full_part_without_layers():
    rng = np.random.default_rng(1)
    k = [rng.normal(size=(12, 32)).astype(np.float16) for _ in range(2)]
    blob = build_seq_state(k, k, v_trans=False, swa_layers=[0, 1], window=8)
    info = parse_seq_state(blob, parts=2)
    assert (info.n_layer, info.cell_count, info.swa.n_layer, info.swa.cell_count) == (0, 12, 2, 8)
    check_seq_state(info, {"n_layer": 0, "cell_count": 12, "swa": {"n_layer": 2, "window": 8}})
