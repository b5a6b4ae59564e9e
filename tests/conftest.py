"""Fixtures: a tiny random llama model with grouped KV heads (seeded), exported once per
session to an fp32 bundle (ONNX fp32 + GGUF f32) and a quantized one (ONNX int4 + GGUF q8_0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Support: my sync stopped on a metered connection, how do I resume it from Settings?",
    "Classify the sentiment of the review: positive, negative or neutral.",
    'Extract JSON: {"name": "Maria", "quantity": 3, "city": "Valencia"} and numbers 0123456789.',
    "Traduire en français : Bonjour, comment allez-vous ? Le train part à huit heures.",
    "Unicode: naïve café — Straße, 東京, Привет мир, emoji 🚀🙂, math ∑ x² ≤ π.",
    "def f(x):\n    return x * 2  # code with    spaces\n\tand tabs",
]

LONG_SYSTEM = " ".join(
    f"Rule {i}: answer politely, keep replies short, mention the plan, and never invent prices."
    for i in range(1, 9))

TASKS_TOML = f'''
[task.support]
system = """{LONG_SYSTEM}"""
max_tokens = 16

[task.sentiment]
system = "Classify the sentiment. Answer with one word."
examples = [
  {{ user = "great product", assistant = "positive" }},
  {{ user = "it broke", assistant = "negative" }},
]
template = "Review: {{input}}"
max_tokens = 16

[task.extract]
system = "Extract JSON with keys name, quantity, city."
examples = [{{ user = "Maria wants 3 mugs in Valencia", assistant = '{{"name": "Maria", "quantity": 3, "city": "Valencia"}}' }}]
max_tokens = 16

[task.raw]
kind = "text"
prefix = "The quick brown fox jumps over the lazy dog. Translate: "
template = "{{input}} =>"
max_tokens = 16
'''

INPUTS = ["my sync stopped", "naïve café 🚀 order 12 mugs", "def f(x): return x"]


def build_tiny_model(out: Path, seed: int = 0, hidden: int = 64) -> Path:
    """A seeded random LlamaForCausalLM (4 query heads, 2 KV heads) with a byte-level BPE
    tokenizer trained on a small corpus and a ChatML chat template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4 + [LONG_SYSTEM], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(str(out))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, initializer_range=0.2, rms_norm_eps=1e-5,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(out))
    return out


# What makes a test integration-tier: it runs a model (a fixture that builds, exports or
# serves one). Everything else is unit-tier unless marked e2e or in the install module.
HEAVY_FIXTURES = {"tiny_model", "tasks_file", "bundle_fp32", "bundle_int4", "bundle_q8kv",
                  "bundle_optimum", "server", "client", "local", "cluster", "built", "llm",
                  "llama_dir", "arch", "peft_bundle", "ref", "default_bundle", "default_home"}
# modules whose tests build or export models themselves (or reach bundles by getfixturevalue)
INTEGRATION_MODULES = {"test_architectures", "test_gguf_convert", "test_parity", "test_ort_cache",
                       "test_train", "test_llama_backend", "test_gguf_kv", "test_prefix_store",
                       "test_quantize", "test_eval", "test_cli", "test_peft", "test_iswa_state",
                       "test_gemma3_onnx"}


def pytest_collection_modifyitems(config, items):
    chosen = config.getoption("-m") or ""
    for item in items:
        if item.get_closest_marker("real"):  # opt-in: `-m real` (models fetched once, minutes)
            if "real" not in chosen:
                item.add_marker(pytest.mark.skip(reason="the real-model tier runs with: pytest -m real"))
            continue
        if item.get_closest_marker("e2e") or item.get_closest_marker("arm64"):  # tiers of their own
            continue
        if item.module.__name__.endswith("test_install"):
            item.add_marker(pytest.mark.install)
        elif (HEAVY_FIXTURES & set(item.fixturenames) or item.get_closest_marker("integration")
              or item.module.__name__.rsplit(".", 1)[-1] in INTEGRATION_MODULES):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session", autouse=True)
def prefix_edge_home(tmp_path_factory):
    """Keep the tests' default bundle and hash cache out of the user's real cache dir."""
    home = tmp_path_factory.mktemp("prefix-edge-home")
    old = os.environ.get("PREFIX_EDGE_HOME")
    os.environ["PREFIX_EDGE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("PREFIX_EDGE_HOME", None)
    else:
        os.environ["PREFIX_EDGE_HOME"] = old


@pytest.fixture(scope="session")
def default_home(tmp_path_factory) -> Path:
    """A $PREFIX_EDGE_HOME holding the default bundle, made once per session by the README's own
    command (`prefix-edge export`, the venv's console script) for the e2e tests and the docs'
    code blocks (tests/test_e2e_default.py, tests/test_doc_examples.py)."""
    home = tmp_path_factory.mktemp("default-home")
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PREFIX_EDGE_HOME": str(home), "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    p = subprocess.run(["bash", "-c", "prefix-edge export"], env=env, capture_output=True, text=True,
                       timeout=1800, cwd=tmp_path_factory.mktemp("default-export"))
    assert p.returncode == 0, f"prefix-edge export: exit {p.returncode}\n{p.stderr[-3000:]}"
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tasks_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("tasks") / "tasks.toml"
    p.write_text(TASKS_TOML, encoding="utf-8")
    return p


def _export(model, tasks, out, quantize, gguf_quant, **kw):
    from prefix_edge.export.build import export_bundle

    export_bundle(model, tasks, out, quantize=quantize, gguf_quant=gguf_quant, progress=False, **kw)
    return out


@pytest.fixture(scope="session")
def bundle_fp32(tiny_model, tasks_file, tmp_path_factory) -> Path:
    return _export(tiny_model, tasks_file, tmp_path_factory.mktemp("b") / "fp32", "none", "f32")


@pytest.fixture(scope="session")
def bundle_int4(tiny_model, tasks_file, tmp_path_factory) -> Path:
    return _export(tiny_model, tasks_file, tmp_path_factory.mktemp("b") / "int4", "int4", "q8_0")


@pytest.fixture(scope="session")
def bundle_q8kv(tasks_file, tmp_path_factory) -> Path:
    """GGUF only, prefixes baked in (and run with) llama.cpp's q8_0 KV cache + flash attention;
    the tiny model with head_dim 32 (a q8_0 cache row per head is whole 32-value blocks)."""
    pytest.importorskip("llama_cpp")
    model = build_tiny_model(tmp_path_factory.mktemp("tiny32") / "model", hidden=128)
    return _export(model, tasks_file, tmp_path_factory.mktemp("b") / "q8kv", "none", "f32",
                   formats=["gguf"], gguf_kv="q8_0")


@pytest.fixture(scope="session")
def bundle_optimum(tiny_model, tasks_file, tmp_path_factory) -> Path:
    """fp32, ONNX only, optimum's graph (`--onnx-builder optimum`): the reference path, where
    optimum-onnx installs beside the export's transformers (its 0.1.0 needs transformers < 4.58)."""
    from prefix_edge.export.onnx import optimum_unavailable

    if (why := optimum_unavailable()) is not None:
        pytest.skip(f"optimum's ONNX builder: {why}")
    return _export(tiny_model, tasks_file, tmp_path_factory.mktemp("b") / "optimum", "none", None,
                   formats=["onnx"], onnx_builder="optimum")


def cli(*args, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `prefix-edge` command in a subprocess."""
    return subprocess.run([sys.executable, "-m", "prefix_edge", *map(str, args)], input=stdin,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=900)


def run_json(*args, **kw) -> dict:
    p = cli("run", "--json", *args, **kw)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)
