"""speculative="mtp": a GGUF model's own MTP head drafts (runtime/engines/llama/mtp.py), the model
verifies in one forward (scheduler/drafting.py), on a tiny seeded Qwen3.5 that ships a head as
its checkpoints do (tests/helpers/families.py build_qwen3_5_mtp), exported by the default path
(llama.cpp's converter keeps the head as blk.4.nextn.*):
- the head through llama.cpp equals transformers running the same layer over the same inputs
  (the model's final-normed hidden states, teacher-forced), argmax for argmax where the
  reference is not a near tie;
- answers equal speculative="off" (the sequential reference), greedy, alone and two at a time:
  with a head whose drafts the model keeps (fewer forwards than tokens) and with one whose drafts
  it rejects (the hybrid's recurrent state cut back through llama.cpp's snapshots each time);
- a runtime opened without mtp_head, or a model without a head, decodes "mtp" as "off" and says
  why once."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from prefix_edge import Runtime

from .helpers.families import build_qwen3_5_mtp

pytest.importorskip("llama_cpp")

TASKS = '''
[task.raw]
kind = "text"
prefix = "The quick brown fox jumps over the lazy dog. "
template = "{input} =>"
max_tokens = 24
'''
INPUTS = ["It rained all day", "The fox", "Numbers: 1, 2, 3", "Once upon a time there was"]
_BUILT: dict = {}


def _bundle(tmp_path_factory, trunk_scale: float, fc_hidden: float = 0.0):
    key = (trunk_scale, fc_hidden)
    if key not in _BUILT:
        from prefix_edge.export.build import export_bundle

        root = tmp_path_factory.mktemp("qwen35-mtp")
        build_qwen3_5_mtp(root / "model", trunk_scale, fc_hidden)
        (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
        export_bundle(root / "model", root / "tasks.toml", root / "bundle", quantize="none",
                      gguf_quant="f32", formats=["gguf"], progress=False)
        _BUILT[key] = (root / "model", root / "bundle")
    return _BUILT[key]


def _answers(bundle, spec: str, mtp_head: bool, together: bool = False):
    with Runtime.open(bundle, backend="gguf", slots=2, mtp_head=mtp_head) as rt:
        run = lambda t: rt.generate("raw", t, temperature=0.0, max_tokens=24, speculative=spec)
        if together:
            with ThreadPoolExecutor(2) as pool:
                return list(pool.map(run, INPUTS))
        return [run(t) for t in INPUTS]


@pytest.mark.integration
def test_the_head_through_llama_cpp_is_transformers_on_the_same_inputs(tmp_path_factory):
    import torch
    import transformers
    from safetensors.torch import load_file

    model_dir, bundle = _bundle(tmp_path_factory, 1.0, fc_hidden=1.0)  # a head that reads the hidden state
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    sd = load_file(str(model_dir / "model.safetensors"))
    with Runtime.open(bundle, backend="gguf", slots=1, mtp_head=True) as rt:
        be = rt.backend
        ids = be.tokenize("The quick brown fox jumps over the lazy dog. It rained all day =>").tolist()
        # the head's draft of one token after ids[p], at every p, after the model read ids[:p]
        drafts = []
        for p in range(2, len(ids)):
            be.seq_restore(0, None)
            be.forward([(0, 0, np.array(ids[:p]))])
            drafts.append(be.mtp_draft(0, ids[p], p, 1)[0])
        be.seq_free(0)

    # transformers: the head (layer 3's weights, mtp.fc over the normed embedding and the final-
    # normed hidden state before) over entries 1.. of the sequence, causal, as llama.cpp fed it
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)

    cap = {}
    hook = model.model.norm.register_forward_hook(lambda m, i, o: cap.__setitem__("h", o))
    with torch.no_grad():
        model(torch.tensor([ids]))
        hook.remove()
        h = cap["h"][0]
        e = model.model.embed_tokens(torch.tensor([ids[1:]]))
        x = torch.cat([rms(e, sd["mtp.pre_fc_norm_embedding.weight"]),
                       rms(h[None, :-1], sd["mtp.pre_fc_norm_hidden.weight"])], -1) @ sd["mtp.fc.weight"].T
        pos = torch.arange(1, len(ids))[None]
        pe = model.model.rotary_emb(x, pos[None].expand(3, 1, -1))
        mask = torch.full((len(ids) - 1,) * 2, float("-inf")).triu(1)[None, None]
        y = model.model.layers[3](x, position_embeddings=pe, attention_mask=mask, position_ids=pos)
        logits = model.lm_head(rms(y[0] if isinstance(y, tuple) else y, sd["mtp.norm.weight"]))[0]
    ref = logits[1:].numpy()  # entry p (p >= 2): the head's logits for the token after ids[p]
    top2 = np.sort(ref, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.05
    assert clear.sum() >= len(ref) // 2
    assert (np.array(drafts)[clear] == ref.argmax(-1)[clear]).all()


@pytest.mark.integration
@pytest.mark.parametrize("trunk_scale, kept", [(0.0, True), (0.1, False)])
def test_mtp_answers_as_off(tmp_path_factory, trunk_scale, kept):
    _, bundle = _bundle(tmp_path_factory, trunk_scale)
    off = _answers(bundle, "off", mtp_head=False)
    alone = _answers(bundle, "mtp", mtp_head=True)
    together = _answers(bundle, "mtp", mtp_head=True, together=True)
    for o, a, t in zip(off, alone, together):
        assert a.text == o.text and t.text == o.text
        assert a.stats.generated_tokens == o.stats.generated_tokens
    drafted = sum(a.stats.drafted_tokens for a in alone)
    accepted = sum(a.stats.accepted_tokens for a in alone)
    assert drafted > 0
    if kept:  # the head computes the model's next step: its drafts are kept, forwards saved
        assert accepted == drafted and accepted >= len(INPUTS) * 12
    else:  # its drafts are rejected: the recurrent state is cut back every time
        assert accepted < drafted / 4


@pytest.mark.integration
def test_mtp_without_a_loaded_head_decodes_as_off_and_says_why(tmp_path_factory, caplog):
    _, bundle = _bundle(tmp_path_factory, 0.0)
    off = _answers(bundle, "off", mtp_head=False)
    with caplog.at_level(logging.WARNING, logger="prefix_edge"):
        plain = _answers(bundle, "mtp", mtp_head=False)
    assert [p.text for p in plain] == [o.text for o in off]
    assert all(p.stats.drafted_tokens == 0 for p in plain)
    said = [r.getMessage() for r in caplog.records if "speculative='mtp'" in r.getMessage()]
    assert len(said) == 1 and "no MTP head, or the runtime was opened without mtp_head" in said[0]


@pytest.mark.integration
def test_run_with_speculative_mtp_loads_the_head(tmp_path_factory):
    from .conftest import run_json

    _, bundle = _bundle(tmp_path_factory, 0.0)
    off = run_json("--bundle", bundle, "--backend", "gguf", "--task", "raw", INPUTS[0])
    mtp = run_json("--bundle", bundle, "--backend", "gguf", "--task", "raw", "--speculative", "mtp", INPUTS[0])
    assert mtp["tokens"] == off["tokens"]
    assert mtp["stats"]["drafted_tokens"] > 0 and mtp["stats"]["accepted_tokens"] == mtp["stats"]["drafted_tokens"]


@pytest.mark.integration
def test_a_hybrid_is_cut_back_within_its_last_forward_only(tmp_path_factory):
    """With the head loaded a hybrid's recurrent state keeps llama.cpp's snapshots: a verified
    draft's rejected tokens are cut back to the state without them; a cut to before
    that forward's first token (where llama.cpp says yes and leaves another state) is refused."""
    from prefix_edge.errors import PrefixEdgeError

    _, bundle = _bundle(tmp_path_factory, 0.1)
    with Runtime.open(bundle, backend="gguf", slots=2, mtp_head=True) as rt:
        be = rt.backend
        ids = be.tokenize("The quick brown fox jumps over the lazy dog =>")
        n = len(ids)
        be.seq_restore(0, None)
        be.forward([(0, 0, ids)])
        be.forward([(0, n, np.array([5, 6, 7, 8]), 4)])
        be.seq_truncate(0, n + 1)  # keep the forward's first token, drop the draft's three
        cut = be.forward([(0, n + 1, np.array([9]))])[0]
        be.seq_restore(1, None)  # the reference: the same forwards without the draft
        be.forward([(1, 0, ids)])
        be.forward([(1, n, np.array([5]))])
        ref = be.forward([(1, n + 1, np.array([9]))])[0]
        # (a k-token forward rounds apart from one-token ones in the last bits; a wrong state
        # is whole logits off: 10-16 here, measured on the cut llama.cpp allows but gets wrong)
        assert np.abs(cut - ref).max() < 1e-3
        be.forward([(0, n + 2, np.array([10, 11]), 2)])
        with pytest.raises(PrefixEdgeError, match="cannot cut sequence 0 back"):
            be.seq_truncate(0, n + 2)  # the whole last forward: its state before is not kept
        be.seq_free(0)
        be.seq_free(1)


@pytest.mark.integration
def test_the_head_keeps_drafting_across_a_grown_context(tmp_path_factory):
    """A sequence that outgrows its stream grows the context (made again, the states written
    back): the head's own context and what it read stay, and its drafts are still the model's
    greedy tokens (the agreeing head), as a model without a head decodes them."""
    from prefix_edge.runtime.engines.llama.engine import LlamaBackend

    _, bundle = _bundle(tmp_path_factory, 0.0)
    gguf = bundle / "gguf" / "model.gguf"
    kw = dict(threads=2, n_ctx=2 * 256, n_seq_max=2, max_ctx_seq=1024)
    with LlamaBackend(gguf, **kw) as plain:
        ids = plain.tokenize(" ".join(["the fox and the dog walk to the river"] * 40))[:300]
        plain.seq_restore(0, None)
        lg = plain.forward([(0, 0, ids)])[0]
        greedy = []
        for i in range(4):
            greedy.append(int(lg.argmax()))
            lg = plain.forward([(0, len(ids) + i, np.array(greedy[-1:]))])[0]
    with LlamaBackend(gguf, mtp_head=True, **kw) as be:
        be.seq_restore(0, None)
        be.forward([(0, 0, ids[:200])])
        assert be.n_ctx_seq == 256
        be.mtp_draft(0, int(ids[200]), 200, 1)  # the head reads the first 200
        lg = be.forward([(0, 200, ids[200:])])[0]  # past the stream's 256 cells: grown
        assert be.n_ctx_seq > 256
        assert int(lg.argmax()) == greedy[0]
        assert be.mtp_draft(0, greedy[0], len(ids), 3) == greedy[1:4]


def _convert(model_dir, out, *extra: str) -> None:
    """llama.cpp's own converter (the copy export runs) on model_dir, f32, with `extra` flags."""
    import subprocess
    import sys

    from prefix_edge.export.llama_convert import converter_dir

    got = subprocess.run([sys.executable, "-m", "prefix_edge.export._run_llama_converter", str(converter_dir()),
                          str(model_dir), "--outfile", str(out), "--outtype", "f32", *extra],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr[-2000:]


@pytest.mark.integration
def test_a_head_in_a_file_of_its_own_drafts_as_the_models_own(tmp_path_factory, tmp_path):
    """llama.cpp's converter can write a model without its head (--no-mtp) and the head alone
    (--mtp: mtp-*.gguf, its nextn block, embeddings and output): a GGUF source with that file
    beside it exports it into the bundle (gguf/mtp-head.gguf, hashed with the model), and a
    runtime opened with mtp_head loads it as a model of its own and drafts from it: the drafts
    the head inside the model's GGUF gives (all kept, for the agreeing head), answers as "off".
    A head file of another model is one line, at export and at open."""
    from prefix_edge.errors import PrefixEdgeError
    from prefix_edge.export.build import export_bundle
    from prefix_edge.runtime.engines.llama.engine import LlamaBackend

    model_dir, embedded = _bundle(tmp_path_factory, 0.0)
    src = tmp_path / "src"
    src.mkdir()
    _convert(model_dir, src / "qwen35-trunk.gguf", "--no-mtp")
    _convert(model_dir, src / "mtp-qwen35.gguf", "--mtp")
    (tmp_path / "tasks.toml").write_text(TASKS, encoding="utf-8")
    manifest = export_bundle(src / "qwen35-trunk.gguf", tmp_path / "tasks.toml", tmp_path / "bundle", formats=["gguf"],
                             progress=False)
    assert "gguf/mtp-head.gguf" in manifest.backends["gguf"].files
    off = _answers(embedded, "off", mtp_head=False)
    own = _answers(embedded, "mtp", mtp_head=True)
    sibling = _answers(tmp_path / "bundle", "mtp", mtp_head=True)
    for o, a, b in zip(off, own, sibling):
        assert b.text == o.text
        assert (b.stats.drafted_tokens, b.stats.accepted_tokens) == (a.stats.drafted_tokens, a.stats.accepted_tokens)
    assert sum(b.stats.accepted_tokens for b in sibling) >= len(INPUTS) * 12
    # a GGUF that is no head as the head: refused at export and when the engine opens it
    with pytest.raises(PrefixEdgeError, match="is not an MTP head of qwen35-trunk.gguf") as e:
        export_bundle(src / "qwen35-trunk.gguf", tmp_path / "tasks.toml", tmp_path / "b2", formats=["gguf"],
                      progress=False, mtp_head=src / "qwen35-trunk.gguf")
    assert "\n" not in str(e.value) and not (tmp_path / "b2").exists()
    with pytest.raises(PrefixEdgeError, match="is not this model's"):
        LlamaBackend(src / "qwen35-trunk.gguf", n_ctx=256, mtp_head=True, mtp_file=src / "qwen35-trunk.gguf")
