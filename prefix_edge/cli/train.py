"""`prefix-edge train`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import app


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="Training data: JSONL lines {\"input\": ..., \"output\": ...}."),
    out: Path = typer.Option(..., "--out", help="Adapter dir to write (a PEFT adapter + prefix_edge_train.json)."),
    base: Optional[Path] = typer.Option(None, "--base", help="HF model dir or .gguf file (default: the embedded SmolLM2-135M-Instruct)."),
    kind: str = typer.Option("prefix", "--kind", help="prefix (PEFT prefix tuning) | prompt (PEFT prompt tuning)."),
    virtual_tokens: int = typer.Option(16, "--virtual-tokens", help="Number of virtual tokens N."),
    steps: int = typer.Option(100, "--steps", help="Optimizer steps."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Learning rate (default: 1e-2 prefix, 3e-2 prompt)."),
    init_text: Optional[str] = typer.Option(None, "--init-text", help="Initialise from this text: prompt tuning uses its embeddings (PromptTuningInit.TEXT), prefix tuning its KV cache."),
    template: str = typer.Option("{input}", "--template", help="How an input is wrapped; '{input}' is replaced once. Use the task's template."),
    batch_size: int = typer.Option(8, "--batch-size", help="Examples per step."),
    seed: int = typer.Option(0, "--seed", help="Seed for initialisation, data order and the held-out split."),
    held_out: Optional[float] = typer.Option(None, "--held-out", help="Fraction of --data kept out of training for the held-out loss (default 0.1)."),
    eval_data: Optional[Path] = typer.Option(None, "--eval", help="Held-out JSONL file instead of a --held-out split."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out."),
) -> None:
    """Train a PEFT prefix-tuning or prompt-tuning adapter on CPU for a `kind = "peft"` task."""
    from ..export.train import train_adapter

    info = train_adapter(base, data, out, kind=kind, virtual_tokens=virtual_tokens, steps=steps, lr=lr,
                         init_text=init_text, template=template, batch_size=batch_size, seed=seed,
                         held_out=held_out, eval_data=eval_data, force=force)
    loss = info["loss"]
    typer.echo(f"adapter written to {out}")
    if loss["held_out_before"] is not None:
        typer.echo(f"held-out loss {loss['held_out_before']:.4f} -> {loss['held_out_after']:.4f} "
                   f"({info['data']['eval']['examples']} examples)")
    t = info["time_s"]
    typer.echo(f"trained {info['steps']} steps in {t['train']:.0f} s ({t['total']:.0f} s in all)")
