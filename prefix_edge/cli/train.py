"""`prefix-edge train`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import app


@app.command()
def train(
    data: Path = typer.Option(..., "--data", help="Training data: JSONL lines {\"input\": ..., \"output\": ...}."),
    out: Path = typer.Option(..., "--out", help="Adapter dir to write (a PEFT adapter + prefix_edge_train.json)."),
    base: Optional[Path] = typer.Option(None, "--base", help="HF model dir or .gguf file (default: the embedded SmolLM2-135M-Instruct)."),
    kind: str = typer.Option("prefix", "--kind", help="prefix (PEFT prefix tuning) | prompt (prompt tuning) | p-tuning (P-tuning, MLP encoder) | cartridge (PEFT CARTRIDGE: the KV itself, first token frozen)."),
    virtual_tokens: int = typer.Option(16, "--virtual-tokens", help="Number of virtual tokens N."),
    steps: int = typer.Option(100, "--steps", help="Optimizer steps."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Learning rate (default: 1e-2 prefix and cartridge, 3e-2 prompt, 1e-3 p-tuning)."),
    init_text: Optional[str] = typer.Option(None, "--init-text", help="Initialise from this text: prompt tuning uses its embeddings (PromptTuningInit.TEXT), prefix tuning and cartridges its KV cache. Not for p-tuning."),
    template: str = typer.Option("{input}", "--template", help="How an input is wrapped; '{input}' is replaced once. Use the task's template."),
    batch_size: int = typer.Option(8, "--batch-size", help="Examples per step."),
    seed: int = typer.Option(0, "--seed", help="Seed for initialisation, data order and the held-out split."),
    held_out: Optional[float] = typer.Option(None, "--held-out", help="Fraction of --data kept out of training for the held-out loss (default 0.1)."),
    eval_data: Optional[Path] = typer.Option(None, "--eval", help="Held-out JSONL file instead of a --held-out split."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Held-out loss every K steps; the adapter written is the state with the best one (default: off, or steps/10 with --patience)."),
    patience: Optional[int] = typer.Option(None, "--patience", help="Stop early after P held-out evaluations without improvement."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Write a resumable checkpoint every K steps (removed when the adapter is written)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Checkpoint dir (default: OUT.ckpt next to --out)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint (same settings required) to the adapter an uninterrupted run writes."),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", hidden=True, help="Stop as if interrupted after N steps of this run (tests)."),
) -> None:
    """Train a PEFT prefix-tuning, prompt-tuning, P-tuning or cartridge adapter on CPU for a `kind = "peft"` task."""
    from ..tune.train import train_adapter

    info = train_adapter(base, data, out, kind=kind, virtual_tokens=virtual_tokens, steps=steps, lr=lr,
                         init_text=init_text, template=template, batch_size=batch_size, seed=seed,
                         held_out=held_out, eval_data=eval_data, force=force, eval_every=eval_every,
                         patience=patience, checkpoint_every=checkpoint_every, checkpoint=checkpoint,
                         resume=resume, max_steps_this_run=stop_after)
    if not info.get("completed", True):
        where = f"; checkpoint in {info['checkpoint']} (continue with --resume)" if info["checkpoint"] else ""
        typer.echo(f"stopped after step {info['steps_run']} (--stop-after){where}")
        return
    loss = info["loss"]
    typer.echo(f"adapter written to {out}")
    if loss["held_out_before"] is not None:
        typer.echo(f"held-out loss {loss['held_out_before']:.4f} -> {loss['held_out_after']:.4f} "
                   f"({info['data']['eval']['examples']} examples)")
    if info["best_step"] is not None:
        early = f"stopped early at step {info['steps_run']}; " if info["stopped_early"] else ""
        typer.echo(f"{early}best held-out loss at step {info['best_step']} (the adapter written)")
    t = info["time_s"]
    resumed = f" (this run from step {info['resumed_from_step']})" if info["resumed_from_step"] else ""
    typer.echo(f"trained {info['steps_run']} steps{resumed} in {t['train']:.0f} s ({t['total']:.0f} s in all)")
