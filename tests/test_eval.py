"""`prefix-edge eval` and `prefix-edge distill` on the tiny seeded model: the metrics (chrF checked
against sacrebleu's own values), eval scoring exactly what the runtime answers, the fp32
reference agreeing with the fp32 bundle and refusing a task that is not the bundle's, and a
distilled prefix whose teacher is the text task and whose bundle answers as its reference."""

from __future__ import annotations

import json

import pytest

from prefix_edge.evaluation.metrics import chrf, guess_metric, json_fields, scorer

from .conftest import INPUTS, TASKS_TOML, cli

# sacrebleu 2.5 `CHRF().sentence_score(hyp, [ref]).score` for each pair (the defaults: char order
# 6, beta 2, no word n-grams, whitespace removed).
SACREBLEU_CHRF = [
    ("Le train part à neuf heures.", "Le train part à huit heures.", 68.0920928804224),
    ("Où est la gare ?", "Où se trouve la gare ?", 38.571963275107485),
    ("Bonjour", "Bonjour, comment allez-vous ?", 22.351537467079183),
    ("ab", "abcdefgh", 23.404255),
    ("abcdefgh", "ab", 55.0),
    ("positive", "Positive.", 69.045506),
    ("Il fait beau.", "Il fait beau aujourd'hui.", 43.684783),
    ("a b", "ab", 100.0),
    ("abc", "xyz", 0.0),
    ("", "abc", 0.0),
]


@pytest.mark.parametrize("hyp,ref,want", SACREBLEU_CHRF)
def test_chrf_equals_sacrebleu(hyp, ref, want):
    assert chrf(hyp, ref) * 100 == pytest.approx(want, abs=1e-5)


def test_label_and_json_metrics():
    label = scorer("label", ["positive", "negative", "neutral"])
    assert label("Positive.", "positive").exact and label("negative, clearly", "negative").score == 1.0
    bad = label("The review is positive", "positive")  # the first word is the answer
    assert (bad.score, bad.valid) == (0.0, False)
    s = json_fields('{"name": " maria ", "quantity": 3, "city": null}\nmore text',
                    '{"name": "Maria", "quantity": 3, "city": "Lyon"}')
    assert s.score == pytest.approx(2 / 3) and not s.exact and s.valid
    assert json_fields('{"name": "Maria", "quantity": "3"}', '{"name": "Maria", "quantity": 3}').score == 0.5
    assert json_fields('{"a": 1, "b": 2}', '{"a": 1}').exact is False  # an extra key is not exact
    assert not json_fields("not json", '{"a": 1}').valid
    assert guess_metric(['{"a": 1}', '{"a": 2}']) == "json-fields"
    assert guess_metric(["positive", "negative", "positive"]) == "label"
    assert guess_metric(["Bonjour !", "Le train part."]) == "chrf"


def _eval(*args):
    p = cli("eval", "--json", *args)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


def _answers(bundle, backend, task, inputs):
    from prefix_edge import Runtime

    with Runtime.open(bundle, backend=backend) as rt:
        return [rt.generate(task, x).text for x in inputs]


def test_eval_scores_what_the_runtime_answers(bundle_fp32, tmp_path):
    inputs = INPUTS + ["great product", "it broke"]
    want = {b: _answers(bundle_fp32, b, "sentiment", inputs) for b in ("onnx", "gguf")}
    # the references: the runtime's own answer on even lines, something else on odd lines
    rows = [{"input": x, "output": want["onnx"][i] if i % 2 == 0 else want["onnx"][i] + " (not this)"}
            for i, x in enumerate(inputs)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = _eval("--bundle", bundle_fp32, "--task", "sentiment", "--data", data, "--metric", "exact")
    assert out["n"] == len(inputs) and out["metric"] == "exact"
    got = {r["label"]: r for r in out["results"]}
    assert set(got) == {"onnx", "gguf"}
    for b, res in got.items():
        assert [r["answer"] for r in res["rows"]] == want[b]
        exact = [r["answer"].strip() == row["output"].strip() for r, row in zip(res["rows"], rows)]
        assert res["exact"] == pytest.approx(sum(exact) / len(exact), abs=1e-4)
        assert res["ttft_ms"] > 0
    assert got["onnx"]["exact"] == pytest.approx(3 / 5, abs=1e-4)
    # the table
    p = cli("eval", "--bundle", bundle_fp32, "--task", "sentiment", "--data", data, "--backend", "onnx",
            "--metric", "chrf", "--limit", "2")
    assert p.returncode == 0, p.stderr.decode()
    lines = p.stdout.decode().splitlines()
    assert "metric chrf" in lines[0] and "2 lines" in lines[0]
    assert lines[2].split()[0] == "onnx" and len(lines) == 3


def test_eval_reference_agrees_with_fp32_bundle(bundle_fp32, tiny_model, tasks_file, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": x, "output": "x"}) + "\n" for x in INPUTS), encoding="utf-8")
    out = _eval("--bundle", bundle_fp32, "--task", "support", "--data", data, "--backend", "onnx",
                "--reference", "--tasks", tasks_file, "--base", tiny_model)
    onnx, ref = out["results"]
    assert ref["label"] == "reference"
    assert [r["answer"] for r in ref["rows"]] == [r["answer"] for r in onnx["rows"]]
    assert all(r["tokens"] > 0 for r in ref["rows"])
    # a task file whose task differs from the bundle's is refused, not scored
    other = tmp_path / "other.toml"
    other.write_text(TASKS_TOML.replace("Rule 3:", "Rule three:"), encoding="utf-8")
    p = cli("eval", "--bundle", bundle_fp32, "--task", "support", "--data", data, "--backend", "onnx",
            "--reference", "--tasks", other, "--base", tiny_model)
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and "\n" not in err and "prefix tokens" in err and "not the bundle's" in err, err


@pytest.mark.parametrize("args,msg", [
    (["--metric", "bleu"], "--metric must be one of"),
    (["--limit", "0"], "--limit must be at least 1"),
    (["--metric", "json-fields"], "is not a JSON object"),
    (["--task", "nope"], "unknown task 'nope'"),
    (["--backend", "tensorrt"], "has no tensorrt model"),
])
def test_eval_errors_are_one_line(bundle_fp32, tmp_path, args, msg):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "a", "output": "b"}\n', encoding="utf-8")
    base = ["--bundle", bundle_fp32, "--data", data] + ([] if "--task" in args else ["--task", "sentiment"])
    p = cli("eval", *base, *args)
    err = p.stderr.decode().strip()
    assert p.returncode != 0 and msg in err and "Traceback" not in err and "\n" not in err, err
    if args[0] == "--metric" and args[1] == "bleu":
        p = cli("eval", "--bundle", bundle_fp32, "--task", "sentiment")  # a demo task's name, another model
        assert p.returncode == 1 and "no embedded held-out set" in p.stderr.decode()


def test_distill_teacher_is_the_task_and_student_bakes_exactly(bundle_fp32, tiny_model, tasks_file, tmp_path):
    from prefix_edge.export.build import export_bundle
    from prefix_edge.tasks import load_tasks

    inputs = INPUTS + ["sync plan price", "resume metered connection", "Settings box fox", "my plan stopped"]
    held = ["the plan price", "sync resume"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"input": x}) + "\n" for x in inputs), encoding="utf-8")
    (tmp_path / "ev.jsonl").write_text("".join(json.dumps({"input": x, "output": ""}) + "\n" for x in held),
                                       encoding="utf-8")
    out = tmp_path / "support_distilled"
    p = cli("distill", "--task", "support", "--tasks", tasks_file, "--base", tiny_model, "--inputs",
            tmp_path / "in.jsonl", "--eval", tmp_path / "ev.jsonl", "--out", out, "--virtual-tokens", 4,
            "--steps", 12, "--lr", 0.5)  # enough to agree on some held-out tokens (0.2 here), not on none
    assert p.returncode == 0, p.stderr.decode()
    assert "prefix positions" in p.stdout.decode()
    report = json.loads((out / "prefix_edge_distill.json").read_text())
    assert report["student"]["prefix_positions"] == 4
    assert report["teacher"]["prefix_positions"] > 40 and report["examples"] == {"train": 7, "held_out": 2}
    agreement = report["agreement_held_out"]  # checked below against values recomputed outside distill
    # the teacher's answers are the text task's answers (fp32 bundle, ONNX: exact to transformers)
    teacher = [json.loads(line) for line in (out / "teacher.jsonl").read_text().splitlines()]
    assert [t["input"] for t in teacher] == inputs + held
    assert [t["output"] for t in teacher] == [a.strip() for a in _answers(bundle_fp32, "onnx", "support", inputs + held)]
    # the student task exports, and its baked prefix answers as its fp32 PEFT reference
    tasks = tmp_path / "tasks.toml"
    tasks.write_text((out / "task.toml").read_text(), encoding="utf-8")
    (spec,) = load_tasks(tasks)
    assert spec.kind == "peft" and spec.template.startswith("<|im_start|>user\n")
    student = export_bundle(tiny_model, tasks, tmp_path / "b", quantize="none", gguf_quant="f32",
                            formats=["onnx"], progress=False)
    res = _eval("--bundle", tmp_path / "b", "--task", "support_distilled", "--data", tmp_path / "ev.jsonl",
                "--metric", "exact", "--reference", "--tasks", tasks, "--base", tiny_model)
    onnx, ref = res["results"]
    assert [r["answer"] for r in onnx["rows"]] == [r["answer"] for r in ref["rows"]]
    assert set(student.tasks) == {"support_distilled"} and set(student.backends) == {"onnx"}
    assert student.tasks["support_distilled"].prefix_tokens == 4  # the virtual tokens only
    # the report's held-out agreement, recomputed: "exact" from the student's greedy answers (the
    # bundle's, equal to its fp32 PEFT reference just above) against the teacher's held-out answers;
    # "token" teacher-forced through the adapter loaded in PEFT itself
    held_teacher = [t["output"] for t in teacher[len(inputs):]]
    answers = [r["answer"].strip() for r in ref["rows"]]
    exact = sum(a == t.strip() for a, t in zip(answers, held_teacher)) / len(held)
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_model))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(out)).eval()
    hit = total = 0
    for x, y in zip(held, held_teacher):
        prompt = tok(spec.template.replace("{input}", x)).input_ids  # as PEFT sees tokenizer(text)
        target = tok(y, add_special_tokens=False).input_ids + [tok.eos_token_id]
        ids = torch.tensor([prompt + target])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        pred = logits[len(prompt) - 1:-1].argmax(-1).tolist()
        hit += sum(p == t for p, t in zip(pred, target))
        total += len(target)
        # the same teacher forcing on the student's own greedy tokens agrees on every one (1.0)
        with torch.no_grad():  # greedy over PeftModel.forward (PEFT 0.21's generate() drops a prefix
            cur = list(prompt)    # under transformers 5: tests/test_peft.py)
            for _ in range(16):
                cur.append(int(model(input_ids=torch.tensor([cur])).logits[0, -1].argmax()))
            own = torch.tensor(cur[len(prompt):])
            forced = model(input_ids=torch.tensor([prompt + own.tolist()])).logits[0, len(prompt) - 1:-1]
        assert forced.argmax(-1).tolist() == own.tolist()
    assert 0 < hit < total  # a value a wrong report could miss
    want = {"exact": round(exact, 4), "token": round(hit / total, 4), "n": len(held)}
    assert agreement == want, (agreement, hit, total)


def test_distill_from_a_bundle_teacher(bundle_fp32, tiny_model, tasks_file, tmp_path):
    """--teacher onnx: the answers come from the bundle's copy of the task (checked to be the task
    file's), and a bundle whose task differs is refused before anything is trained."""
    inputs = INPUTS + ["sync plan price", "resume metered connection"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"input": x}) + "\n" for x in inputs), encoding="utf-8")
    out = tmp_path / "student"
    args = ["distill", "--task", "support", "--base", tiny_model, "--inputs", tmp_path / "in.jsonl",
            "--virtual-tokens", 4, "--steps", 2, "--teacher", "onnx", "--bundle", bundle_fp32]
    p = cli(*args, "--tasks", tasks_file, "--out", out)
    assert p.returncode == 0, p.stderr.decode()
    teacher = [json.loads(line)["output"] for line in (out / "teacher.jsonl").read_text().splitlines()]
    assert teacher == [a.strip() for a in _answers(bundle_fp32, "onnx", "support", inputs)]
    assert json.loads((out / "prefix_edge_distill.json").read_text())["teacher"]["model"] == "onnx"
    other = tmp_path / "other.toml"
    other.write_text(TASKS_TOML.replace("Rule 3:", "Rule three:"), encoding="utf-8")
    p = cli(*args, "--tasks", other, "--out", tmp_path / "never")
    err = p.stderr.decode().strip()
    assert p.returncode == 1 and "not the bundle's" in err and "\n" not in err, err
    assert not (tmp_path / "never").exists()
