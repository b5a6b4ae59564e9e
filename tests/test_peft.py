"""Trained prefixes: PEFT prompt-learning adapters baked for both backends, checked against
PEFT + transformers on the tiny seeded model (one bundle, ONNX fp32 + GGUF f32, for all types)."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

from prefix_edge import PrefixEdgeError, Runtime

from .conftest import INPUTS, cli
from .helpers.adapters import make_adapter

N_TOKENS = 16
MARGIN = 0.01  # PEFT's top-2 logit margin below which an F16 KV cache cannot be held to its choice
TEXT_AFTER = "Translate: "
# task -> (adapter dir, text after the trained part)
TASKS = {
    "prefix": ("prefix", ""),
    "cartridge": ("cartridge", ""),
    "prompt": ("prompt", ""),
    "ptuning": ("ptuning", ""),
    "prefix_text": ("prefix", TEXT_AFTER),
    "prompt_text": ("prompt", TEXT_AFTER),
}
PEFT_TYPE = {"prefix": "PREFIX_TUNING", "cartridge": "CARTRIDGE", "prompt": "PROMPT_TUNING",
             "ptuning": "P_TUNING"}


def tasks_toml() -> str:
    out = []
    for task, (adapter, text) in TASKS.items():
        out += [f"[task.{task}]", 'kind = "peft"', f'adapter = "adapters/{adapter}"']
        out += [f'prefix = "{text}"'] if text else ["chat = false"]
        out += [f"max_tokens = {N_TOKENS}", ""]
    return "\n".join(out)


@pytest.fixture(scope="module")
def peft_bundle(tiny_model, tmp_path_factory):
    from prefix_edge.export.build import export_bundle

    root = tmp_path_factory.mktemp("peft")
    for i, kind in enumerate(PEFT_TYPE):
        make_adapter(tiny_model, kind, root / "adapters" / kind, seed=100 + i)
    (root / "tasks.toml").write_text(tasks_toml(), encoding="utf-8")
    manifest = export_bundle(tiny_model, root / "tasks.toml", root / "bundle", quantize="none",
                             gguf_quant="f32", progress=False)
    assert not manifest.extra.get("warnings")  # same base model: no warning
    return root


class Reference:
    """PEFT + transformers on the raw text: first-step logits and the greedy continuation."""

    def __init__(self, model_dir, adapters_dir):
        from transformers import AutoTokenizer

        self.model_dir, self.adapters_dir = model_dir, adapters_dir
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self._models, self._cache = {}, {}

    def model(self, adapter: str):
        if adapter not in self._models:
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(str(self.model_dir)).eval()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._models[adapter] = PeftModel.from_pretrained(
                    base, str(self.adapters_dir / adapter)).eval()
        return self._models[adapter]

    def ids(self, task: str, text: str) -> list[int]:
        """What PEFT is called on: the task's text part, then the input (token-level
        concatenation, as the bundle splits them), tokenized without special tokens (this
        tokenizer adds none)."""
        before = TASKS[task][1]
        pre = self.tok(before, add_special_tokens=False).input_ids if before else []
        return pre + self.tok(text, add_special_tokens=False).input_ids

    def run(self, task: str, text: str):
        """(first-step logits, greedy tokens, top-2 margin of each greedy step): a manual
        greedy loop over PeftModel.forward on the whole sequence (no cache involved)."""
        import torch

        key = (task, text)
        if key not in self._cache:
            pm = self.model(TASKS[task][0])
            cur = torch.tensor([self.ids(task, text)])
            first, tokens, margins = None, [], []
            with torch.no_grad():
                for _ in range(N_TOKENS):
                    logits = pm(input_ids=cur, attention_mask=torch.ones_like(cur)).logits[0, -1]
                    first = logits.numpy().copy() if first is None else first
                    top = torch.topk(logits, 2)
                    tok = int(top.indices[0])
                    if tok == self.tok.eos_token_id:
                        break
                    tokens.append(tok)
                    margins.append(float(top.values[0] - top.values[1]))
                    cur = torch.cat([cur, torch.tensor([[tok]])], dim=1)
            self._cache[key] = (first, tokens, margins)
        return self._cache[key]


@pytest.fixture(scope="module")
def ref(tiny_model, peft_bundle):
    return Reference(tiny_model, peft_bundle / "adapters")


@pytest.fixture(scope="module")
def runtimes(peft_bundle):
    rts = {b: Runtime.open(peft_bundle / "bundle", backend=b) for b in ("onnx", "gguf")}
    yield rts
    for rt in rts.values():
        rt.close()


def first_logits(rt, task, text):
    prefix, _ = rt.prefixes.get(task)
    rt.backend.begin(prefix)
    return rt.backend.prefill(rt.encode_input(task, text))


def test_peft_generate_is_the_reference(ref):
    """The manual greedy loop over PeftModel.forward is what transformers' generate() decodes for
    every adapter type: the base model's, from the KV adapters' (prefix tuning, cartridges) prompt
    cache or after the soft prompts' embeddings. (PEFT 0.21's own generate() decodes another model
    under transformers 5: it drops a prefix-tuning prefix, and a soft prompt after the first token;
    the eval and distill references go the way this test does: tune/hf_task.py.)"""
    import torch

    for task in PEFT_TYPE:
        _, tokens, _ = ref.run(task, INPUTS[0])
        ids = torch.tensor([ref.ids(task, INPUTS[0])])
        pm = ref.model(TASKS[task][0])
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT: "Position ids are not supported ..."
            if PEFT_TYPE[task] in ("PREFIX_TUNING", "CARTRIDGE"):
                past = pm.get_prompt(batch_size=1)
                n = past.get_seq_length()
                out = pm.get_base_model().generate(
                    input_ids=ids, past_key_values=past, attention_mask=torch.ones(1, n + ids.shape[1], dtype=torch.long),
                    max_new_tokens=N_TOKENS, do_sample=False, pad_token_id=ref.tok.pad_token_id)
            else:  # the soft prompt's embeddings before the text's
                embeds = pm.get_base_model().get_input_embeddings()(ids)
                embeds = torch.cat([pm.get_prompt(batch_size=1).to(embeds.dtype), embeds], dim=1)
                out = pm.get_base_model().generate(
                    inputs_embeds=embeds, attention_mask=torch.ones(1, embeds.shape[1], dtype=torch.long),
                    max_new_tokens=N_TOKENS, do_sample=False, pad_token_id=ref.tok.pad_token_id)
                out = torch.cat([ids, out], dim=1)  # (generate returns the new tokens only)
        gen = out[0, ids.shape[1]:].tolist()
        if ref.tok.eos_token_id in gen:
            gen = gen[:gen.index(ref.tok.eos_token_id)]
        assert gen == tokens, task


@pytest.mark.parametrize("task", list(TASKS))
def test_onnx_fp32_matches_peft(runtimes, ref, task):
    """ONNX fp32: first-step logits within 1e-4 of PEFT's, 16 greedy tokens identical."""
    rt = runtimes["onnx"]
    produced = 0
    for text in INPUTS:
        logits, tokens, _ = ref.run(task, text)
        assert np.max(np.abs(first_logits(rt, task, text) - logits)) < 1e-4, text
        assert rt.generate(task, text, max_tokens=N_TOKENS).tokens == tokens, text
        produced += len(tokens)
    assert produced > 2 * N_TOKENS  # greedy did not stop at once: the comparison has substance


@pytest.mark.parametrize("task", list(TASKS))
def test_gguf_f32_greedy_matches_peft(runtimes, ref, task):
    """GGUF f32: 16 greedy tokens identical to PEFT's, up to near-ties an F16 cache cannot call.

    llama.cpp keeps its KV cache in F16, so its logits sit a few 1e-3 from PEFT's fp32 ones
    (asserted below to 2e-2). Where PEFT's own top-2 margin is below MARGIN the greedy choice is a
    coin toss for any F16 cache; this random tiny model has such steps. So a sequence may diverge
    only at such a step (everything before it identical), and at most one input per task may."""
    rt = runtimes["gguf"]
    diverged = []
    for text in INPUTS:
        logits, tokens, margins = ref.run(task, text)
        assert np.max(np.abs(first_logits(rt, task, text) - logits)) < 2e-2, text
        got = rt.generate(task, text, max_tokens=N_TOKENS).tokens
        if got != tokens:
            i = next(i for i, (a, b) in enumerate(zip(got + [-1], tokens + [-1])) if a != b)
            margin = margins[i] if i < len(margins) else float("inf")  # inf: PEFT ended (EOS)
            assert margin < MARGIN, (f"{text!r} diverges at step {i}, where PEFT's top-2 margin is "
                                     f"{margin:.4f}: {got} vs {tokens}")
            diverged.append((text, i, round(margin, 4)))
    assert len(diverged) <= 1, diverged


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
def test_prefix_tuning_is_not_the_base_model(runtimes, ref, backend):
    """The baked trained prefix really steers the model: its logits are far from the plain
    model's on the same input (and they are PEFT's, above)."""
    rt = runtimes[backend]
    for text in INPUTS:
        ids = rt.encode_input("prefix", text)
        rt.backend.begin(None)
        plain = rt.backend.prefill(ids)
        tuned = first_logits(rt, "prefix", text)
        assert np.max(np.abs(tuned - plain)) > 0.5, text
        assert np.max(np.abs(tuned - ref.run("prefix", text)[0])) < 2e-2


def test_manifest_and_prefix_files(peft_bundle, runtimes):
    m = runtimes["onnx"].manifest
    for task, (adapter, text) in TASKS.items():
        info = m.tasks[task]
        assert info.kind == "peft" and info.adapter["peft_type"] == PEFT_TYPE[adapter]
        assert info.adapter["name"] == adapter and len(info.adapter["sha256"]) == 64
        assert info.n_virtual == info.adapter["num_virtual_tokens"] > 0
        assert (info.prefix_tokens > info.n_virtual) == bool(text)
        for backend, rt in runtimes.items():
            prefix, _ = rt.prefixes.get(task)
            assert prefix.n_virtual == info.n_virtual and prefix.n_tokens == info.prefix_tokens
            assert prefix.metadata["n_virtual"] == str(info.n_virtual)
            r = rt.generate(task, INPUTS[0], max_tokens=2)
            assert r.stats.prefix_tokens == info.prefix_tokens
    # a prefix file whose virtual count disagrees with the manifest is refused
    b = shutil.copytree(peft_bundle / "bundle", peft_bundle / "edited")
    doc = json.loads((b / "manifest.json").read_text())
    doc["tasks"]["prefix"]["n_virtual"] = 5
    (b / "manifest.json").write_text(json.dumps(doc))
    with Runtime.open(b, backend="onnx") as rt, pytest.raises(PrefixEdgeError, match="virtual|other settings"):
        rt.generate("prefix", "x")


def test_no_prefix_cache_is_refused(runtimes, peft_bundle):
    """A trained prefix has no text to prefill: a one-line error, not a silent text-only run."""
    with pytest.raises(PrefixEdgeError, match="trained prefix") as e:
        runtimes["onnx"].generate("prompt", "x", use_prefix_cache=False)
    assert "\n" not in str(e.value)
    p = cli("run", "--bundle", peft_bundle / "bundle", "--task", "prefix", "--no-prefix-cache", "x")
    assert p.returncode == 1
    assert p.stderr.decode().strip().splitlines()[-1].startswith("error: task 'prefix' is a trained")


def test_tasks_and_inspect_show_the_adapter(peft_bundle):
    p = cli("tasks", "--bundle", peft_bundle / "bundle")
    assert p.returncode == 0 and "PREFIX_TUNING" in p.stdout.decode()
    p = cli("inspect", "--bundle", peft_bundle / "bundle", "--json")
    info = json.loads(p.stdout)["tasks"]["ptuning"]
    assert info["adapter"]["peft_type"] == "P_TUNING" and info["n_virtual"] == 4


def test_gguf_embeddings_input_is_the_token_path(runtimes, tiny_model):
    """LlamaBackend.prefill_embeddings of a text's embedding rows equals prefilling its ids."""
    from safetensors.numpy import load_file

    table = load_file(str(tiny_model / "model.safetensors"))["model.embed_tokens.weight"]
    be = runtimes["gguf"].backend
    ids = runtimes["gguf"].encode_input("prefix", INPUTS[1])
    be.begin(None)
    a = be.prefill(ids)
    be.begin(None)
    b = be.prefill_embeddings(table[ids])
    assert np.max(np.abs(a - b)) < 1e-4
    with pytest.raises(PrefixEdgeError, match="n_embd|rows"):
        be.prefill_embeddings(table[ids][:, :8])


# --- adapter checks (fast: they fail before any model export) ------------------------------

def _copy_adapter(peft_bundle, tmp_path, kind, **config):
    d = shutil.copytree(peft_bundle / "adapters" / kind, tmp_path / "a")
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg.update(config)
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    tasks = tmp_path / "t.toml"
    tasks.write_text('[task.t]\nkind = "peft"\nadapter = "a"\nchat = false\n')
    return tasks


@pytest.mark.parametrize("kind, edit, words", [
    ("prefix", {"num_layers": 3}, ["num_layers = 3", "2 layers"]),
    ("prefix", {"token_dim": 64}, ["token_dim = 64", "32 KV heads × head dim"]),
    ("cartridge", {"num_attention_heads": 4}, ["num_attention_heads = 4", "2 KV heads"]),
    ("prompt", {"token_dim": 32}, ["token_dim = 32", "64 as hidden size"]),
    ("ptuning", {"peft_type": "LORA"}, ["'LORA'", "PROMPT_TUNING"]),
    ("prefix", {"num_virtual_tokens": 9}, ["num_virtual_tokens = 9", "6"]),
])
def test_adapter_mismatch_is_an_error_naming_both_sides(peft_bundle, tiny_model, tmp_path, kind,
                                                        edit, words):
    from prefix_edge.export.build import export_bundle

    tasks = _copy_adapter(peft_bundle, tmp_path, kind, **edit)
    with pytest.raises(PrefixEdgeError) as e:
        export_bundle(tiny_model, tasks, tmp_path / "out", progress=False)
    msg = str(e.value)
    assert str(tasks) in msg and "task 't'" in msg and "key 'adapter'" in msg and "\n" not in msg
    for w in words:
        assert w in msg, msg
    assert not (tmp_path / "out").exists()


def test_other_base_model_is_a_warning(peft_bundle):
    from prefix_edge.export.peft import check_adapter, read_adapter, same_model_name
    from prefix_edge.tasks import TaskSpec

    from prefix_edge.bundle import Manifest

    m = Manifest.read(peft_bundle / "bundle").model
    spec = TaskSpec("t", "peft", adapter=peft_bundle / "adapters" / "prefix")
    a = read_adapter(spec)
    said = []
    check_adapter(a, m, ["model"], said.append)
    assert said == []
    a.config["base_model_name_or_path"] = "someone/Other-Model-1B"
    check_adapter(a, m, ["model", "/x/model"], said.append)
    assert len(said) == 1 and "someone/Other-Model-1B" in said[0] and "'model'" in said[0]
    assert same_model_name("HuggingFaceTB/SmolLM2-135M-Instruct",
                           ["SmolLM2-135M-Instruct.Q4_1.gguf"])
    assert not same_model_name("HuggingFaceTB/SmolLM2-360M-Instruct",
                               ["SmolLM2-135M-Instruct.Q4_1.gguf"])


def test_key_permutation_is_the_weight_permutation(monkeypatch):
    """A key computed with the k_proj rows as llama.cpp's converter permutes them (its own
    LlamaModel.permute) = the HF key with its dims permuted by hf_keys_to_llama_cpp."""
    from prefix_edge.export.llama_convert import converter_dir
    from prefix_edge.export.peft import hf_keys_to_llama_cpp

    conv = converter_dir()
    monkeypatch.syspath_prepend(str(conv / "gguf-py"))
    monkeypatch.syspath_prepend(str(conv))
    from conversion.llama import LlamaModel

    rng = np.random.default_rng(0)
    n_kv, hd, d_in = 3, 8, 16
    w, x = rng.standard_normal((n_kv * hd, d_in)), rng.standard_normal(d_in)
    k_gguf = (LlamaModel.permute(w, 2 * n_kv, n_kv) @ x).reshape(n_kv, hd)
    k_hf = (w @ x).reshape(n_kv, hd)
    assert np.array_equal(hf_keys_to_llama_cpp(k_hf), k_gguf)


def test_leading_special_tokens_go_after_the_virtual_part():
    """A chat = false task's text starts with the BOS a tokenizer adds: a peft one's after the
    virtual part (as PEFT sees `tokenizer(text)`: soft prompt, then BOS and text), a text one's
    first (as llama.cpp and transformers read the prompt); a chat task's template writes its own."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from prefix_edge.tasks import leading_special_ids, prefix_ids
    from prefix_edge.tasks import RenderedTask

    tok = Tokenizer(models.WordLevel({"<s>": 0, "a": 1, "b": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    assert leading_special_ids(tok) == []
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert leading_special_ids(tok) == [0]
    raw = RenderedTask("a b", "", "", "{input}", False)
    assert prefix_ids(tok, raw, "t", 100, n_virtual=4) == [0, 1, 2]
    assert prefix_ids(tok, raw, "t", 100) == [0, 1, 2]
    assert prefix_ids(tok, RenderedTask("a b", "", "", "{input}", True), "t", 100) == [1, 2]
    assert prefix_ids(tok, RenderedTask("", "", "", "{input}", False), "t", 100, n_virtual=4) == [0]
    assert prefix_ids(tok, RenderedTask("a", "", "", "{input}", True), "t", 100, n_virtual=4) == [1]
    with pytest.raises(PrefixEdgeError, match="4 virtual \\+ 3 text"):
        prefix_ids(tok, raw, "t", 7, n_virtual=4)


def _positions(sess, n: int) -> dict:
    """The position inputs of either ONNX graph for a pass of n tokens from position 0."""
    feeds = {"attention_mask": np.ones((1, n), np.int64), "position_ids": np.arange(n)[None],
             "seqlens_k": np.array([n - 1], np.int32), "total_sequence_length": np.array(n, np.int32)}
    names = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


@pytest.mark.parametrize("builder", ["own", "optimum"])
def test_soft_prompt_route_is_exact_on_int4(peft_bundle, tiny_model, tmp_path, builder):
    """ONNX int4 (quantized embedding table, offline-optimized graph): the soft prompt's KV baked
    through the edited copy of the deployed graph, then the input prefilled on the deployed graph,
    gives the logits of one pass of [soft prompt; the input's embeddings] through that copy, i.e.
    what the deployed int4 model computes for PEFT's input."""
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import load_file

    from prefix_edge.export.build import export_bundle
    from prefix_edge.export.onnx import optimum_unavailable
    from prefix_edge.export.soft_prompt import SoftPromptRunner

    if builder == "optimum" and (why := optimum_unavailable()) is not None:
        pytest.skip(f"optimum's ONNX builder: {why}")
    tasks = tmp_path / "t.toml"
    tasks.write_text(f'[task.p]\nkind = "peft"\nadapter = "{peft_bundle}/adapters/prompt"\n'
                     'chat = false\n')
    out = tmp_path / "b"
    export_bundle(tiny_model, tasks, out, formats=("onnx",), quantize="int4", progress=False,
                  onnx_builder=builder)
    soft = load_file(str(peft_bundle / "adapters/prompt/adapter_model.safetensors"))["prompt_embeddings"]
    with Runtime.open(out, backend="onnx") as rt:
        be, path = rt.backend, out / "onnx/model.onnx"
        # the deployed graph's own (int4) embedding rows, read off its lookup's output
        m = onnx.load(str(path))
        lookup = next(n for n in m.graph.node if n.op_type.startswith("Gather") and "input_ids" in n.input)
        m.graph.output.append(onnx.helper.make_tensor_value_info(lookup.output[0], 1, None))
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        runner = SoftPromptRunner(path, soft.shape[1])
        empty = {n: np.zeros((1, be.n_kv_heads, 0, be.head_dim), be.kv_dtype) for n in be.past_names}
        for text in INPUTS:
            ids = rt.encode_input("p", text)
            n = len(ids)
            rows = sess.run([lookup.output[0]], {"input_ids": ids[None], **empty,
                                                 **_positions(sess, n)})[0][0]
            emb = np.concatenate([soft, rows])
            feeds = {runner.emb_name: emb[None].astype(runner.emb_dtype), **empty,
                     **_positions(runner.session, len(emb))}
            if runner.feed_ids:
                feeds["input_ids"] = np.zeros((1, len(emb)), np.int64)
            one_pass = runner.session.run(["logits"], feeds)[0][0, -1]
            assert np.max(np.abs(first_logits(rt, "p", text) - one_pass)) < 1e-4, text
        runner.close()
