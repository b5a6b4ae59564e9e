"""Compressed prefixes (`export --compress-prefix`): the kept tokens at slots 0..K-1 with keys
re-rotated by -(P - K) attend exactly as the whole prefix with the dropped tokens masked out.

References: transformers fp32 with the dropped positions masked and the original positions
(ONNX fp32, to 1e-4), llama.cpp's own cache with the dropped cells removed (`seq_rm`) after a
prefill of the whole prefix (GGUF), and a cold run of the uncompressed bundle
(`use_prefix_cache=False` prefills the whole prefix)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from prefix_edge import PrefixEdgeError, Runtime
from prefix_edge.bundle import Bundle
from prefix_edge.export.compress import choose
from prefix_edge.runtime.engines.kv import shift_keys
from prefix_edge.tasks.taskfile import compress_ratio as parse_ratio

from .conftest import INPUTS, _export

TASK = "support"


# -- unit: the rotation ---------------------------------------------------------------------
def _hf_rotated(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """HF's apply_rotary_pos_emb (rotate_half) of x [..., n, d] at positions `pos` [n]."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    freqs = np.outer(pos, inv_freq)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = torch.tensor(np.cos(emb))[None], torch.tensor(np.sin(emb))[None]
    t = torch.tensor(x)[None]
    q, _ = apply_rotary_pos_emb(t, t, cos, sin)
    return q[0].numpy()


def test_shift_keys_is_a_rotation_to_the_earlier_position():
    rng = np.random.default_rng(0)
    d, n = 16, 12
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    x = rng.standard_normal((2, n, d))
    pos = np.arange(40, 40 + n)
    at_p = _hf_rotated(x, pos, inv_freq)
    want = _hf_rotated(x, pos - 25, inv_freq)
    got = shift_keys(at_p, -25, inv_freq, "halves")
    assert np.abs(got - want).max() < 1e-12
    # llama.cpp's NORM layout: dims (2i, 2i+1) pair; the same rotation, the dims permuted
    from prefix_edge.export.peft import hf_keys_to_llama_cpp

    got_adj = shift_keys(hf_keys_to_llama_cpp(at_p), -25, inv_freq, "adjacent")
    assert np.abs(got_adj - hf_keys_to_llama_cpp(want)).max() < 1e-12
    # partial rotary: only the leading 2 * len(inv_freq) dims turn
    part = shift_keys(at_p, -25, inv_freq[:4], "halves")
    assert np.array_equal(part[..., 8:], at_p[..., 8:])


def test_choose_keeps_sinks_recent_special_and_the_budget():
    ids = list(range(100, 200))
    ids[50] = 7
    scores = np.zeros(100)
    scores[[30, 60, 70]] = [3, 2, 1]
    kept = choose(scores, ids, 4.0, special={7})
    assert kept == sorted(kept) and len(kept) == 25
    assert {0, 1, 2, 3, 50, 30, 60, 70} <= set(kept) and set(range(84, 100)) <= set(kept)


@pytest.mark.parametrize("rotation", [0, 64])
def test_extract_kv_reads_a_q8_0_cache_back(rotation):
    """A compressed GGUF prefix re-reads a q8_0 cache (seqstate.extract_kv, the Hadamard
    rotation undone): the values written, to Q8_0's rounding, and unrotated blobs rebuild
    byte for byte."""
    from prefix_edge.llamacpp.seqstate import GGML_TYPE_Q8_0, extract_kv, parse_seq_state
    from prefix_edge.llamacpp.seqstate_write import build_seq_state

    rng = np.random.default_rng(1)
    k = [rng.standard_normal((7, 128)).astype(np.float16) for _ in range(2)]
    v = [rng.standard_normal((7, 128)).astype(np.float16) for _ in range(2)]
    blob = build_seq_state(k, v, False, kv_type=GGML_TYPE_Q8_0, rotation=rotation)
    ks, vs = extract_kv(blob, parse_seq_state(blob), rotation)
    for got, want in zip(ks + vs, k + v):
        assert got.dtype == np.float32 and np.abs(got - want).max() < 0.03
    if not rotation:
        again = build_seq_state([a.astype(np.float16) for a in ks], [a.astype(np.float16) for a in vs],
                                False, kv_type=GGML_TYPE_Q8_0)
        assert again == blob


@pytest.mark.parametrize("bad", ["0.5", "1e9", "x", "-2", "nan"])
def test_bad_ratio_is_one_line(bad):
    with pytest.raises(PrefixEdgeError, match="--compress-prefix"):
        parse_ratio(bad)
    assert parse_ratio("none") is None and parse_ratio("auto") == "auto" and parse_ratio("2") == 2.0


# -- integration: exported bundles ----------------------------------------------------------
@pytest.fixture(scope="module")
def compressed(tiny_model, tasks_file, tmp_path_factory):
    return _export(tiny_model, tasks_file, tmp_path_factory.mktemp("b") / "c2", "none", "f32",
                   compress_prefix="2")


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def _wrapped(bundle, text) -> list[int]:
    """The task's input ids as the runtime wraps them (the manifest's strings around it)."""
    from tokenizers import Tokenizer

    t = _manifest(bundle)["tasks"][TASK]
    tok = Tokenizer.from_file(str(bundle / "tokenizer/tokenizer.json"))
    return tok.encode(t["input_before"] + text + t["input_after"], add_special_tokens=False).ids


def test_manifest_records_what_was_kept(compressed):
    t = _manifest(compressed)["tasks"][TASK]
    c = t["compression"]
    assert c["source_tokens"] == len(c["source_ids"]) and c["kept_tokens"] == len(c["kept"]) == t["prefix_tokens"]
    assert c["kept_tokens"] == -(-c["source_tokens"] // 2)
    assert 0.0 <= c["reconstruction_agreement"] <= 1.0
    # short prefixes are kept whole
    assert _manifest(compressed)["tasks"]["raw"].get("compression") is None


def _reference_logits(model_dir, src, kept, inp):
    """transformers fp32: the whole prefix prefilled (its KV computed over all of it), then the
    input at the original positions, attending only to the kept prefix positions."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                             attn_implementation="eager").eval()
    mask = np.zeros(len(src) + len(inp), np.int64)
    mask[kept] = 1
    mask[len(src):] = 1
    with torch.no_grad():
        cache = m(torch.tensor([src]), use_cache=True).past_key_values
        out = m(torch.tensor([inp]), past_key_values=cache, attention_mask=torch.tensor(mask[None]),
                position_ids=torch.arange(len(src), len(src) + len(inp))[None])
    return out.logits[0, -1].numpy()


def test_onnx_compressed_prefix_equals_masked_reference(compressed, tiny_model):
    from prefix_edge.runtime.engines import open_backend

    c = _manifest(compressed)["tasks"][TASK]["compression"]
    be = open_backend("onnx", Bundle.open(compressed).model_file("onnx"), n_ctx=512)
    try:
        prefix = be.load_prefix(compressed / _manifest(compressed)["tasks"][TASK]["prefixes"]["onnx"]["file"])
        assert prefix.n_tokens == c["kept_tokens"]
        assert prefix.ids.tolist() == [c["source_ids"][i] for i in c["kept"]]
        for text in INPUTS:
            inp = _wrapped(compressed, text)
            be.begin(prefix)
            got = be.prefill(np.array(inp))
            want = _reference_logits(tiny_model, c["source_ids"], c["kept"], inp)
            assert np.abs(got - want).max() < 1e-4, text
            # and not the whole prefix's answer: compression changed what is attended to
            full = _reference_logits(tiny_model, c["source_ids"], list(range(len(c["source_ids"]))), inp)
            assert np.abs(full - want).max() > 1e-3
    finally:
        be.close()


def test_gguf_compressed_prefix_equals_llama_cpp_with_cells_removed(compressed):
    pytest.importorskip("llama_cpp")
    from prefix_edge.runtime.engines import open_backend

    m = _manifest(compressed)
    c = m["tasks"][TASK]["compression"]
    src, kept = c["source_ids"], c["kept"]
    dropped = sorted(set(range(len(src))) - set(kept))
    be = open_backend("gguf", Bundle.open(compressed).model_file("gguf"), n_ctx=512)
    try:
        prefix = be.load_prefix(compressed / m["tasks"][TASK]["prefixes"]["gguf"]["file"])
        for text in INPUTS:
            inp = np.array(_wrapped(compressed, text))
            be.begin(None)
            be.prefill(np.array(src))
            for p in dropped:  # llama.cpp's own cache, the dropped cells removed
                be._L.llama_memory_seq_rm(be.mem, be.single_seq, p, p + 1)
            want = be.forward([(be.single_seq, len(src), inp)])[0]
            be.begin(prefix)
            got = be.prefill(inp)
            scale = np.abs(want).max()
            assert np.abs(got - want).max() < 2e-3 * scale, text  # keys rounded to f16 once more
            assert int(got.argmax()) == int(want.argmax())
    finally:
        be.close()


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_runtime_answers_and_prefill_baseline(compressed, bundle_fp32, backend):
    """Through the Runtime: a compressed task answers from K positions; use_prefix_cache=False
    prefills the whole prefix and gives the uncompressed bundle's cached answer."""
    if backend == "gguf":
        pytest.importorskip("llama_cpp")
    with Runtime.open(compressed, backend=backend) as rt, Runtime.open(bundle_fp32, backend=backend) as full:
        for text in INPUTS:
            r = rt.generate(TASK, text, max_tokens=8)
            assert r.stats.prefix_tokens == rt.manifest.tasks[TASK].prefix_tokens < len(rt.manifest.tasks[TASK].source_ids)
            cold = rt.generate(TASK, text, max_tokens=8, use_prefix_cache=False)
            ref = full.generate(TASK, text, max_tokens=8)
            assert cold.tokens == ref.tokens, text
            assert cold.stats.prefix_tokens == len(rt.manifest.tasks[TASK].source_ids)
        conv = rt.chat(TASK)  # a conversation resumes on the compressed prefix's KV
        first = conv.send(INPUTS[0], max_tokens=6)
        second = conv.send(INPUTS[1], max_tokens=6)
        again = rt.generate(TASK, messages=conv.messages[:-1], max_tokens=6, use_turn_cache=False)
        assert again.tokens == second.tokens and first.tokens


def test_tampered_compression_record_is_refused(compressed, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(compressed, b)
    m = _manifest(b)
    m["tasks"][TASK]["compression"]["kept"][1] = m["tasks"][TASK]["compression"]["kept"][0]
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PrefixEdgeError, match="compression"):
        Runtime.open(b, backend="onnx")


def test_sliding_window_models_are_refused(tmp_path):
    from types import SimpleNamespace

    from prefix_edge.export.compress import check_model

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PrefixEdgeError, match="sliding-window"):
        check_model(tmp_path, SimpleNamespace(sliding_layers=[0]))
    (tmp_path / "config.json").write_text(json.dumps({"rope_scaling": {"rope_type": "longrope"}}))
    with pytest.raises(PrefixEdgeError, match="longrope"):
        check_model(tmp_path, SimpleNamespace(sliding_layers=[]))


def test_eval_scores_the_whole_prefix_beside_the_compressed_one(compressed, tmp_path):
    """`prefix-edge eval` on a compressed task: a '<backend> whole' row per backend (the whole
    prefix prefilled), and the compression in the JSON; `inspect` says what was kept."""
    from .conftest import cli

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": t, "output": "x"}) + "\n" for t in INPUTS[:2]))
    p = cli("eval", "--task", TASK, "--bundle", compressed, "--data", data, "--backend", "onnx", "--json")
    assert p.returncode == 0, p.stderr.decode()
    got = json.loads(p.stdout)
    assert [r["label"] for r in got["results"]] == ["onnx", "onnx whole"]
    c = _manifest(compressed)["tasks"][TASK]["compression"]
    assert got["compression"]["kept_tokens"] == c["kept_tokens"] and "source_ids" not in got["compression"]
    p = cli("tasks", "--bundle", compressed)
    assert p.returncode == 0 and f"{c['kept_tokens']} (of {c['source_tokens']}, compressed)" in p.stdout.decode()


def test_auto_picks_a_ratio_whose_agreement_holds(tiny_model):
    """`auto`: the largest ratio of AUTO_RATIOS whose reconstruction agreement is at least
    AUTO_AGREEMENT, measured the same way as a fixed ratio's (or the prefix kept whole)."""
    from tokenizers import Tokenizer

    from prefix_edge.export.compress import AUTO_AGREEMENT, AUTO_RATIOS, Planner

    from .conftest import LONG_SYSTEM

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    ids = tok.encode(LONG_SYSTEM, add_special_tokens=False).ids
    planner = Planner(tiny_model, tok, set())
    try:
        auto = planner.plan("t", ids, "auto")
        fixed = {r: planner.plan("t", ids, r) for r in AUTO_RATIOS}
    finally:
        planner.close()
    passing = [r for r in AUTO_RATIOS if fixed[r].agreement >= AUTO_AGREEMENT]
    if passing:
        assert auto.ratio == max(passing) and auto.kept == fixed[max(passing)].kept
    else:
        assert auto is None
    assert fixed[4.0].agreement <= fixed[1.5].agreement + 0.05  # keeping more reconstructs better


def test_task_file_sets_compression_per_task(tiny_model, tmp_path):
    """A task's own `compress_prefix` beats export's flag; "none" keeps it whole; a peft task or
    a bad value is one line naming the key."""
    from prefix_edge.tasks import load_tasks

    from .conftest import LONG_SYSTEM

    f = tmp_path / "t.toml"
    f.write_text(f'[task.long]\nsystem = """{LONG_SYSTEM}"""\ncompress_prefix = 3\n\n'
                 f'[task.kept]\nsystem = """{LONG_SYSTEM}"""\ncompress_prefix = "none"\n\n'
                 f'[task.flag]\nsystem = """{LONG_SYSTEM}"""\n', encoding="utf-8")
    out = _export(tiny_model, f, tmp_path / "b", "none", None, formats=["onnx"], compress_prefix="2")
    tasks = _manifest(out)["tasks"]
    src = tasks["kept"]["prefix_tokens"]
    assert tasks["long"]["compression"]["ratio"] == 3.0 and tasks["long"]["prefix_tokens"] == -(-src // 3)
    assert tasks["flag"]["compression"]["ratio"] == 2.0 and tasks["kept"].get("compression") is None
    for body, what in (('system = "x"\ncompress_prefix = 0.5', "ratio in"),
                       ('system = "x"\ncompress_prefix = true', "ratio in"),
                       ('kind = "peft"\nadapter = "a"\ncompress_prefix = 2', "kept whole")):
        f.write_text(f"[task.t]\n{body}\n", encoding="utf-8")
        with pytest.raises(PrefixEdgeError, match=f"compress_prefix.*{what}"):
            load_tasks(f)
