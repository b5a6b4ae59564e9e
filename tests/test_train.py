"""`prefix-edge train` on the tiny seeded model: all four adapter kinds load in PEFT and the held-out
loss drops, a text-initialised prefix or cartridge equals that text's KV, early stopping keeps the
best state, a resumed run ends with the adapter of an uninterrupted one, and bad data or option
combinations give one-line CLI errors."""

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


LR = {"prefix": 0.05, "cartridge": 0.05, "prompt": 0.3, "p-tuning": 0.01}


@pytest.mark.parametrize("kind,peft_type", [("prefix", "PREFIX_TUNING"), ("prompt", "PROMPT_TUNING"),
                                            ("p-tuning", "P_TUNING"), ("cartridge", "CARTRIDGE")])
def test_train_loads_in_peft_and_learns(model, data, tmp_path, kind, peft_type):
    out = tmp_path / "adapter"
    p = cli("--base", model, "--data", data[0], "--eval", data[1], "--kind", kind, "--virtual-tokens", 4,
            "--steps", 12, "--lr", LR[kind], "--batch-size", 8, "--template", TEMPLATE, "--out", out)
    assert p.returncode == 0, p.stderr.decode()
    assert "held-out loss" in p.stdout.decode()
    assert {f.name for f in out.iterdir()} == {"adapter_config.json", "adapter_model.safetensors",
                                               "prefix_edge_train.json"}
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["peft_type"] == peft_type and cfg["num_virtual_tokens"] == 4
    assert cfg["base_model_name_or_path"] == model.name
    info = json.loads((out / "prefix_edge_train.json").read_text())
    assert info["template"] == TEMPLATE and info["steps"] == info["steps_run"] == 12
    assert info["data"]["train"]["examples"] == 48 and not info["stopped_early"]
    assert len(info["data"]["train"]["sha256"]) == 64 and info["data"]["eval"]["examples"] == 12
    assert info["loss"]["held_out_after"] < info["loss"]["held_out_before"], info["loss"]
    _, peft_model = _load(model, out)
    assert peft_model.peft_config["default"].peft_type.value == peft_type
    # the loaded adapter gives the held-out loss the training recorded
    assert _held_out(model, peft_model, data[1]) == pytest.approx(info["loss"]["held_out_after"], abs=1e-4)
    # the CLI refuses to overwrite without --force
    p = cli("--base", model, "--data", data[0], "--out", out, "--steps", 1)
    assert p.returncode != 0 and b"--force" in p.stderr


def _held_out(model, peft_model, path, batch_size=8):
    from transformers import AutoTokenizer

    from prefix_edge.tasks.datafile import read_jsonl
    from prefix_edge.tune.train import encode
    from prefix_edge.tune.train_loop import held_out_loss

    tok = AutoTokenizer.from_pretrained(str(model))
    eos = peft_model.config.eos_token_id
    rows = [encode(tok, TEMPLATE, ex, eos) for ex in read_jsonl(path)]
    return held_out_loss(peft_model, rows, tok.pad_token_id, batch_size)


@pytest.mark.parametrize("kind", ["prefix", "cartridge"])
def test_init_text_is_that_text_as_a_prefix(model, data, tmp_path, kind):
    """A prefix or cartridge initialised from text (and barely trained) gives the logits of that text
    prefilled."""
    import torch
    from transformers import AutoTokenizer

    from prefix_edge.tune.train import train_adapter

    init = "Classify the sentiment."
    tok = AutoTokenizer.from_pretrained(str(model))
    n = len(tok(init, add_special_tokens=False)["input_ids"])
    train_adapter(model, data[0], tmp_path / "a", kind=kind, virtual_tokens=n, steps=1, lr=1e-12,
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


def _tensors(adapter):
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))


def test_early_stopping_keeps_the_best_state(model, data, tmp_path):
    """Held-out text unlike the training outputs: its loss soon rises, training stops before the
    budget, and the adapter written is the state with the best held-out loss."""
    from prefix_edge.tune.train import train_adapter

    other = _write(tmp_path / "other.jsonl", [{"input": r["input"], "output": "Pack my box with five dozen jugs."}
                                             for r in _rows(8, 1)])
    info = train_adapter(model, data[0], tmp_path / "a", kind="prefix", virtual_tokens=4, steps=20, lr=0.3,
                         batch_size=4, template=TEMPLATE, eval_data=other, eval_every=1, patience=2,
                         progress=False)
    curve = info["loss"]["held_out_curve"]
    assert info["stopped_early"] and info["steps_run"] < 20 and curve[-1][0] == info["steps_run"]
    assert [s for s, _ in curve] == list(range(info["steps_run"] + 1))  # step 0 = before training
    best = min(curve, key=lambda c: c[1])
    assert info["best_step"] == best[0] < info["steps_run"] and info["loss"]["held_out_after"] == best[1]
    assert info["steps_run"] - info["best_step"] == 2  # patience 2: two evaluations without improvement
    _, peft_model = _load(model, tmp_path / "a")
    assert _held_out(model, peft_model, other, batch_size=4) == pytest.approx(best[1], abs=1e-5)
    assert not (tmp_path / "a.ckpt").exists()


@pytest.mark.parametrize("kind", ["p-tuning", "cartridge"])  # an MLP encoder; a frozen row
def test_resume_equals_uninterrupted(model, data, tmp_path, kind):
    """Checkpoint every 2 steps, stop after 5 (the last checkpoint is step 4), resume: the adapter,
    losses and held-out curve equal those of one uninterrupted run."""
    from prefix_edge.tune.train import train_adapter

    kw = dict(kind=kind, virtual_tokens=4, steps=9, lr=LR[kind], batch_size=5, template=TEMPLATE,
              held_out=0.25, eval_every=3, progress=False)
    straight = train_adapter(model, data[0], tmp_path / "straight", **kw)
    part = train_adapter(model, data[0], tmp_path / "resumed", checkpoint_every=2, max_steps_this_run=5, **kw)
    ckpt = tmp_path / "resumed.ckpt"
    assert part == {"completed": False, "steps_run": 5, "checkpoint": str(ckpt)}
    assert not (tmp_path / "resumed").exists() and (ckpt / "checkpoint.pt").is_file()
    resumed = train_adapter(model, data[0], tmp_path / "resumed", checkpoint_every=2, resume=True, **kw)
    assert resumed["resumed_from_step"] == 4 and resumed["steps_run"] == 9
    a, b = _tensors(tmp_path / "straight"), _tensors(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    for key in ("loss", "best_step", "steps_run"):
        assert resumed[key] == straight[key], key
    assert not ckpt.exists()  # removed after the adapter was written


def test_checkpoint_with_other_settings_is_refused(model, data, tmp_path):
    from prefix_edge.errors import PrefixEdgeError
    from prefix_edge.tune.train import train_adapter

    out, ckpt = tmp_path / "a", tmp_path / "ck"
    kw = dict(kind="prefix", virtual_tokens=4, steps=6, lr=0.05, batch_size=4, template=TEMPLATE,
              progress=False, checkpoint=ckpt)
    train_adapter(model, data[0], out, checkpoint_every=2, max_steps_this_run=3, **kw)
    with pytest.raises(PrefixEdgeError, match="--resume to continue it"):  # not silently overwritten
        train_adapter(model, data[0], out, checkpoint_every=2, **kw)
    with pytest.raises(PrefixEdgeError) as e:
        train_adapter(model, data[0], out, resume=True, **{**kw, "lr": 0.1, "steps": 8})
    msg = str(e.value)
    assert "\n" not in msg and str(ckpt) in msg and "--lr 0.05 there, 0.1 now" in msg
    assert "--steps 6 there, 8 now" in msg and "--kind" not in msg
    with pytest.raises(PrefixEdgeError, match="--data sha256"):
        train_adapter(model, data[1], out, resume=True, **kw)
    with pytest.raises(PrefixEdgeError, match="--kind"):
        train_adapter(model, data[0], out, resume=True, **{**kw, "kind": "cartridge"})
    assert (ckpt / "checkpoint.pt").is_file() and not out.exists()
    train_adapter(model, data[0], out, resume=True, **kw)  # the same settings resume
    assert out.is_dir() and not ckpt.exists()


@pytest.mark.parametrize("args,words", [
    (["--resume"], ["no checkpoint to resume from", "out.ckpt"]),
    (["--patience", 0], ["--patience must be at least 1"]),
    (["--eval-every", 2, "--held-out", 0], ["need held-out examples"]),
    (["--kind", "p-tuning", "--init-text", "hello"], ["--init-text", "p-tuning"]),
    (["--kind", "cartridge", "--virtual-tokens", 1], ["cartridge", "at least 2"]),
    (["--checkpoint", "ck"], ["--checkpoint needs --checkpoint-every"]),
    (["--kind", "lora"], ["p-tuning, cartridge"]),
])
def test_bad_option_combination_is_one_line_error(tmp_path, model, data, args, words):
    p = cli("--base", model, "--data", data[0], "--out", tmp_path / "out", *args)
    err = p.stderr.decode()
    assert p.returncode != 0 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], err
    assert not (tmp_path / "out").exists()


def test_cli_stop_and_resume(model, data, tmp_path):
    out = tmp_path / "a"
    args = ("--base", model, "--data", data[0], "--eval", data[1], "--kind", "cartridge", "--virtual-tokens", 3,
            "--steps", 6, "--batch-size", 4, "--template", TEMPLATE, "--out", out, "--patience", 10,
            "--checkpoint-every", 2)
    p = cli(*args, "--stop-after", 3)
    assert p.returncode == 0 and b"continue with --resume" in p.stdout, p.stderr.decode()
    p = cli(*args, "--resume")
    assert p.returncode == 0, p.stderr.decode()
    assert b"this run from step 2" in p.stdout and b"best held-out loss at step" in p.stdout
    info = json.loads((out / "prefix_edge_train.json").read_text())
    assert info["eval_every"] == 1 and info["resumed_from_step"] == 2 and len(info["loss"]["held_out_curve"]) == 7
