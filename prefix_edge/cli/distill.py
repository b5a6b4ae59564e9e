"""`prefix-edge distill`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import app


@app.command()
def distill(
    task: str = typer.Option(..., "--task", "-t", help="The text task to distill (its prompt is the teacher)."),
    inputs: Path = typer.Option(..., "--inputs", help="JSONL lines {\"input\": ...} the teacher answers and the student learns from (an \"output\" is ignored)."),
    out: Path = typer.Option(..., "--out", help="Adapter dir to write (PEFT adapter + reports + task.toml)."),
    eval_inputs: Optional[Path] = typer.Option(None, "--eval", help="Held-out inputs: held-out loss, early checks and agreement with the teacher."),
    tasks_file: Optional[Path] = typer.Option(None, "--tasks", help="Task file (default: the demo tasks)."),
    base: Optional[Path] = typer.Option(None, "--base", help="HF model dir or .gguf (default: the embedded SmolLM2-135M-Instruct)."),
    name: Optional[str] = typer.Option(None, "--name", help="The student task's name in task.toml (default: TASK_distilled)."),
    kind: str = typer.Option("prefix", "--kind", help="prefix (PEFT prefix tuning) | cartridge."),
    virtual_tokens: int = typer.Option(32, "--virtual-tokens", help="The student's prefix positions V."),
    steps: int = typer.Option(200, "--steps", help="Optimizer steps."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Learning rate (default: train's default for --kind)."),
    batch_size: int = typer.Option(8, "--batch-size"),
    seed: int = typer.Option(0, "--seed"),
    init: str = typer.Option("prompt", "--init", help="prompt: start from the KV of the prompt's first V tokens | random."),
    teacher: str = typer.Option("fp32", "--teacher", help="fp32: the task in transformers | gguf, onnx: the task in --bundle (faster)."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="--teacher gguf|onnx: the bundle (default bundle when omitted)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out adapter."),
) -> None:
    """Distill a long text task into a short trained prefix that answers as the prompt does."""
    from ..tune.distill import distill as run

    r = run(task, inputs, out, tasks_file=tasks_file, base=base, eval_inputs=eval_inputs, name=name, kind=kind,
            virtual_tokens=virtual_tokens, steps=steps, lr=lr, batch_size=batch_size, seed=seed, init=init,
            teacher=teacher, bundle=bundle, force=force)
    t, s = r["teacher"], r["student"]
    typer.echo(f"adapter written to {out}")
    typer.echo(f"prefix positions {t['prefix_positions']} -> {s['prefix_positions']} ({r['positions_ratio']}x fewer)")
    a = r["agreement_held_out"]
    if a:
        typer.echo(f"agreement with the teacher on {a['n']} held-out inputs: answers {a['exact']:.3f}, "
                   f"tokens {a['token']:.3f}")
    typer.echo(f"task: {out / 'task.toml'} (add it to a task file and export)")
