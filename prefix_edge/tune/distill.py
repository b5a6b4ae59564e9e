"""`prefix-edge distill`: a long text task → a short trained prefix (context distillation).

The teacher is the text task (its system prompt / examples as a prefix) with the task's own
decoding options, run in transformers at fp32 (tune/hf_task.py; the default) or, faster,
through a bundle's copy of the task (`--teacher gguf|onnx`: the deployed model answers, 4 inputs
at a time; the bundle's task is checked to be the task file's). Its answers on the given inputs
become the training targets of a prefix-tuning (or cartridge) adapter of V virtual tokens on the
same base model (tune/train.py): sequence-level distillation. The student sees the input
wrapped exactly as the teacher's user turn was (chat markup included), so its task is a `peft`,
`chat = false` task whose template is that wrapping, and it keeps the teacher's decoding options.
By default the prefix starts as the KV of the teacher prompt's first V tokens.

Written into the adapter dir: the PEFT adapter, prefix_edge_train.json (from train),
prefix_edge_distill.json (teacher, positions saved, agreement with the teacher on the held-out
inputs), teacher.jsonl (the teacher's answers the student was trained and checked on) and
task.toml (the student task, ready to paste into a task file).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ..tasks.datafile import Example, read_jsonl, write_jsonl
from ..errors import PrefixEdgeError
from ..tasks import TaskSpec, load_tasks

DISTILL_FILE = "prefix_edge_distill.json"
TEACHERS = ("fp32", "gguf", "onnx")
TEACHER_SLOTS = 4  # a bundle teacher answers this many inputs at once


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def student_toml(name: str, adapter: str, template: str, defaults: dict) -> str:
    lines = [f"[task.{name}]", 'kind = "peft"', f"adapter = {_toml_str(adapter)}", "chat = false",
             f"template = {_toml_str(template)}"]
    for k, v in defaults.items():
        if isinstance(v, str):
            v = _toml_str(v)
        elif isinstance(v, list):
            v = "[" + ", ".join(_toml_str(x) for x in v) + "]"
        elif isinstance(v, dict):
            v = "{ " + ", ".join(f'"{a}" = {b}' for a, b in v.items()) + " }"
        elif isinstance(v, bool):
            v = str(v).lower()
        lines.append(f"{k} = {v}")
    return "\n".join(lines) + "\n"


def _teacher_answers(answer, rows: list[Example], bar, label: str, workers: int = 1) -> list[Example]:
    """The teacher's answers to `rows`, in order (`answer`: text -> text)."""
    from concurrent.futures import ThreadPoolExecutor

    t = bar.add_task(label, total=len(rows), info="")

    def one(ex: Example) -> Example:
        a = Example(ex.input, answer(ex.input).strip())
        bar.advance(t)
        return a

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, rows))


def _bundle_teacher(bundle: Path | None, backend: str, task: str, hf):
    """A Runtime over the bundle's copy of `task`, once it is checked to be `hf`'s task."""
    from ..bundle import Bundle
    from .reference import check_same_task
    from ..runtime.runtime import Runtime

    try:
        opened = Bundle.open(bundle)
    except PrefixEdgeError as e:
        raise PrefixEdgeError(f"--teacher {backend}: {e}") from None
    if task not in opened.tasks:
        raise PrefixEdgeError(f"--teacher {backend}: bundle {opened.root} has no task {task!r}")
    check_same_task(hf, opened, task, f"--teacher {backend}: task {task!r}")
    return Runtime.open(opened.root, backend=backend, slots=TEACHER_SLOTS)


def _agreement(student, teacher_rows: list[Example], answers: list[str]) -> dict:
    """exact: the student's greedy answer equals the teacher's; token: teacher-forced top-1
    agreement of the student's raw logits with the teacher's answer tokens (EOS included)."""
    torch = student.torch
    hit = total = 0
    for ex in teacher_rows:
        target = student.tok.encode(ex.output, add_special_tokens=False).ids + [student.eos[0]]
        x = student.prefix + student.input_ids(ex.input)
        ids = torch.tensor([x + target])
        with torch.no_grad():
            logits = student.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        pred = logits[-len(target) - 1:-1].argmax(-1).tolist()
        hit += sum(p == t for p, t in zip(pred, target))
        total += len(target)
    exact = sum(a.strip() == ex.output.strip() for a, ex in zip(answers, teacher_rows))
    return {"exact": round(exact / len(teacher_rows), 4), "token": round(hit / max(total, 1), 4),
            "n": len(teacher_rows)}


def distill(task: str, inputs: Path, out: Path, *, tasks_file: Path | None = None, base: Path | None = None,
            eval_inputs: Path | None = None, name: str | None = None, kind: str = "prefix",
            virtual_tokens: int = 32, steps: int = 200, lr: float | None = None, batch_size: int = 8,
            seed: int = 0, init: str = "prompt", teacher: str = "fp32", bundle: Path | None = None,
            force: bool = False, progress: bool = True) -> dict:
    from ..paths import default_tasks_file
    from ..options import resolve
    from .hf_task import HFTask
    from ..progress import bars
    from ..export.source import default_model_path
    from .train import train_adapter

    if teacher not in TEACHERS:
        raise PrefixEdgeError(f"--teacher must be one of {', '.join(TEACHERS)}, not {teacher!r}")
    if init not in ("prompt", "random"):
        raise PrefixEdgeError(f"--init must be prompt or random, not {init!r}")
    if kind not in ("prefix", "cartridge"):
        raise PrefixEdgeError(f"--kind must be prefix or cartridge (a KV prefix), not {kind!r}")
    out = Path(out)
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise PrefixEdgeError(f"{out} exists; use --force to replace it")
    if tasks_file is None:
        if base is not None:
            raise PrefixEdgeError("give --tasks: the task file of the task to distill")
        tasks_file = default_tasks_file()
    base = Path(base) if base is not None else default_model_path()
    spec = next((s for s in load_tasks(tasks_file) if s.name == task), None)
    if spec is None:
        raise PrefixEdgeError(f"{tasks_file} has no task {task!r}")
    if spec.kind != "text":
        raise PrefixEdgeError(f"task {task!r} is a {spec.kind} task; distill takes a text task (a prompt)")
    train_in = read_jsonl(inputs, need_output=False)
    eval_in = read_jsonl(eval_inputs, need_output=False) if eval_inputs is not None else []
    opts = resolve(spec.defaults)
    t_start = time.perf_counter()
    hf = HFTask(spec, base)
    rt = None
    try:
        r = hf.rendered
        student_template = r.input_before + r.template + r.input_after
        if student_template.count("{input}") != 1:
            raise PrefixEdgeError(f"task {task!r}: its input wrapping contains '{{input}}' more than once")
        if teacher == "fp32":
            answer, workers = (lambda x: hf.generate(x, opts).text), 1
        else:
            rt = _bundle_teacher(bundle, teacher, task, hf)
            answer, workers = (lambda x: rt.generate(task, x).text), TEACHER_SLOTS
        with bars(progress) as bar:
            train_rows = _teacher_answers(answer, train_in, bar, "teacher answers (train)", workers)
            eval_rows = _teacher_answers(answer, eval_in, bar, "teacher answers (held-out)", workers)
        teacher_s = time.perf_counter() - t_start
        init_text = r.prefix_text if init == "prompt" else None
        teacher_positions = hf.prefix_positions
    finally:
        if rt is not None:
            rt.close()
        hf.close()
    with tempfile.TemporaryDirectory(prefix="prefix-edge-distill-") as work:
        tr, ev = Path(work) / "teacher.train.jsonl", Path(work) / "teacher.heldout.jsonl"
        write_jsonl(tr, train_rows)
        if eval_rows:
            write_jsonl(ev, eval_rows)
        info = train_adapter(base, tr, out, kind=kind, virtual_tokens=virtual_tokens, steps=steps, lr=lr,
                             init_text=init_text, template=student_template, batch_size=batch_size, seed=seed,
                             eval_data=ev if eval_rows else None, force=force, progress=progress)
    name = name or f"{task}_distilled"
    student_spec = TaskSpec(name, "peft", template=student_template, chat=False, defaults=dict(spec.defaults),
                            adapter=out)
    agreement = None
    if eval_rows:
        student = HFTask(student_spec, base)
        try:
            answers = [student.generate(ex.input, opts).text.strip() for ex in eval_rows]
            agreement = _agreement(student, eval_rows, answers)
        finally:
            student.close()
    report = {
        "format": "prefix-edge-distill", "version": 1,
        "teacher": {"task": task, "tasks_file": Path(tasks_file).name, "prefix_positions": teacher_positions,
                    "model": teacher},
        "student": {"task": name, "kind": kind, "prefix_positions": virtual_tokens, "template": student_template,
                    "init": init},
        "positions_ratio": round(teacher_positions / virtual_tokens, 2),
        "examples": {"train": len(train_rows), "held_out": len(eval_rows)},
        "agreement_held_out": agreement, "time_s": {"teacher": round(teacher_s, 1),
                                                    "total": round(time.perf_counter() - t_start, 1)},
    }
    write_jsonl(out / "teacher.jsonl", train_rows + eval_rows)
    (out / DISTILL_FILE).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "task.toml").write_text(student_toml(name, out.name, student_template, spec.defaults), encoding="utf-8")
    return report | {"train": info}
