"""`prefix-edge train` on the tiny seeded model: both adapter kinds load in PEFT, the held-out loss
drops, a text-initialised prefix equals that text's KV, and bad data gives one-line CLI errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from .conftest import build_tiny_model

TEMPLATE = "Review: {input} =>"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(n, seed):
    """A learnable mapping: the label follows a keyword of the input."""
    rng = random.Random(seed)
    words = ["quick brown fox", "lazy dog", "my sync stopped", "five dozen jugs", "the train part"]
    out = []
    for _ in range(n):
        good = rng.random() < 0.5
        text = f"{'great product' if good else 'it broke'}, {rng.choice(words)}"
        out.append({"input": text, "output": "positive" if good else "negative"})
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("train") / "model", seed=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return _write(d / "train.jsonl", _rows(48, 0)), _write(d / "eval.jsonl", _rows(12, 1))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "prefix_edge", "train", *map(str, args)],
                          capture_output=True, timeout=300)


def _load(model, adapter):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    return base, PeftModel.from_pretrained(base, str(adapter)).eval()


@pytest.mark.parametrize("kind,peft_type", [("prefix", "PREFIX_TUNING"), ("prompt", "PROMPT_TUNING")])
def test_train_loads_in_peft_and_learns(model, data, tmp_path, kind, peft_type):
    out = tmp_path / "adapter"
    p = cli("--base", model, "--data", data[0], "--eval", data[1], "--kind", kind, "--virtual-tokens", 4,
            "--steps", 12, "--lr", 0.05 if kind == "prefix" else 0.3, "--batch-size", 8,
            "--template", TEMPLATE, "--out", out)
    assert p.returncode == 0, p.stderr.decode()
    assert "held-out loss" in p.stdout.decode()
    assert {f.name for f in out.iterdir()} == {"adapter_config.json", "adapter_model.safetensors",
                                               "prefix_edge_train.json"}
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == peft_type and cfg["num_virtual_tokens"] == 4
    assert cfg["base_model_name_or_path"] == model.name
    info = json.loads((out / "prefix_edge_train.json").read_text())
    assert info["template"] == TEMPLATE and info["steps"] == 12 and info["data"]["train"]["examples"] == 48
    assert len(info["data"]["train"]["sha256"]) == 64 and info["data"]["eval"]["examples"] == 12
    assert info["loss"]["held_out_after"] < info["loss"]["held_out_before"], info["loss"]
    _, peft_model = _load(model, out)
    assert peft_model.peft_config["default"].peft_type.value == peft_type
    # the CLI refuses to overwrite without --force
    p = cli("--base", model, "--data", data[0], "--out", out, "--steps", 1)
    assert p.returncode != 0 and b"--force" in p.stderr


def test_prefix_init_text_is_that_text_as_a_prefix(model, data, tmp_path):
    """A prefix initialised from text (and barely trained) gives the logits of that text prefilled."""
    import torch
    from transformers import AutoTokenizer

    from prefix_edge.export.train import train_adapter

    init = "Classify the sentiment."
    tok = AutoTokenizer.from_pretrained(str(model))
    n = len(tok(init, add_special_tokens=False)["input_ids"])
    train_adapter(model, data[0], tmp_path / "a", kind="prefix", virtual_tokens=n, steps=1, lr=1e-12,
                  init_text=init, template=TEMPLATE, held_out=0.0, progress=False)
    base, peft_model = _load(model, tmp_path / "a")
    x = tok(TEMPLATE.replace("{input}", "great product"), add_special_tokens=False, return_tensors="pt")["input_ids"]
    ref_ids = torch.cat([tok(init, add_special_tokens=False, return_tensors="pt")["input_ids"], x], dim=1)
    with torch.no_grad():
        got = peft_model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]
        with peft_model.disable_adapter():
            ref = base(ref_ids).logits[0, n:]
    assert (got - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("content,args,words", [
    (None, [], ["no such data file"]),
    ('{"input": "a", "output": "b"}\n\n{"input": "c", "output": \n', [], [":3:", "not valid JSON"]),
    ('{"input": "a", "output": "b"}\n{"input": "c"}\n', [], [":2:", "missing key 'output'"]),
    ('{"input": "a", "output": "b"}\n', ["--virtual-tokens", 0], ["--virtual-tokens"]),
    ('{"input": "a", "output": "b"}\n', ["--template", "no placeholder"], ["{input}"]),
])
def test_bad_input_is_one_line_error(tmp_path, model, content, args, words):
    path = tmp_path / "data.jsonl"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    p = cli("--base", model, "--data", path, "--kind", "prefix", "--out", tmp_path / "out", *args)
    err = p.stderr.decode()
    assert p.returncode != 0 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], err
    for w in words:
        assert w in lines[-1], err
    assert not (tmp_path / "out").exists()
