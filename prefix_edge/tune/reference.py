"""The fp32 reference for `prefix-edge eval --reference`: the task rebuilt from its source (task
file + base model, + PEFT adapter) in transformers (hf_task.py). Here, beside HFTask, and not in
evaluation/: it needs the export extra (tune/, export/), which evaluation/ sits above.

The source must be the one the bundle was exported from: the task's rendering (chat, wrapping,
template), its prefix token ids and its adapter's sha256 are compared with the bundle, and any
difference is an error (a reference of another task would be a wrong number, not a slow one).
"""

from __future__ import annotations

from pathlib import Path

from ..bundle import Bundle
from ..errors import PrefixEdgeError
from ..tasks import load_tasks
from ..options import resolve
from ..evaluation.run import Answer


def check_same_task(hf, bundle: Bundle, task: str, what: str) -> None:
    """Refuse unless `hf` (an HFTask) is the bundle's `task`: the same kind,
    rendering, prefix token ids and adapter."""
    info, spec, r = bundle.tasks[task], hf.spec, hf.rendered
    baked = bundle.prefix_ids(task).tolist()
    mismatch = [name for name, ok in (
        ("kind", spec.kind == info.kind), ("chat", r.chat == info.chat),
        ("input wrapping", (r.input_before, r.input_after, r.template) ==
         (info.input_before, info.input_after, info.template)),
        ("prefix tokens", hf.prefix == baked),
        ("adapter", hf.adapter is None or (info.adapter or {}).get("sha256") == hf.adapter.sha256)) if not ok]
    if mismatch:
        raise PrefixEdgeError(f"{what} is not the bundle's (differs in: {', '.join(mismatch)}); "
                              "give the task file it was exported from")


def open_reference(bundle: Bundle, task: str, tasks_file: Path | None, base: Path | None):
    """(HFTask, generate function for `evaluate`) for the bundle's `task`."""
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")):
        raise PrefixEdgeError("--reference needs the export extra: pip install 'prefix-edge[export]'")
    from .hf_task import HFTask
    from ..export.source import DEFAULT_GGUF, default_model_path
    from ..paths import default_tasks_file

    manifest = bundle.manifest
    if manifest.model.source == DEFAULT_GGUF:  # the embedded default model and its demo tasks
        base = base or default_model_path()
        tasks_file = tasks_file or default_tasks_file()
    if base is None or tasks_file is None:
        raise PrefixEdgeError(f"--reference: the bundle was exported from {manifest.model.source}; "
                              "give --base (that model) and --tasks (the task file)")
    spec = next((s for s in load_tasks(tasks_file) if s.name == task), None)
    if spec is None:
        raise PrefixEdgeError(f"--reference: {tasks_file} has no task {task!r}")
    hf = HFTask(spec, Path(base), manifest.model.n_ctx)
    try:
        check_same_task(hf, bundle, task, f"--reference: task {task!r} in {tasks_file}")
    except PrefixEdgeError:
        hf.close()
        raise
    opts = resolve(manifest.tasks[task].defaults)

    def generate(text: str) -> Answer:
        g = hf.generate(text, opts)
        return Answer(g.text, g.ttft_ms, len(g.tokens), g.decode_s)

    return hf, generate
