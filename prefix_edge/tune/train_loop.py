"""The optimisation loop of `prefix-edge train`: batches and losses, AdamW with linear warm-up
and decay, periodic held-out evaluation with early stopping (the adapter state with the best
held-out loss is kept), and checkpoints that a resumed run continues from exactly.

A checkpoint is one file, `checkpoint.pt` in the checkpoint dir, replaced atomically (written
beside it, fsynced, renamed): the adapter's prompt-encoder state, the optimizer and scheduler
state, the torch and data-order RNG states with the rest of the current shuffled pass, the step,
the train losses, the held-out curve and the best state so far, and the settings it was made
with. A resumed run must have the same settings (else a one-line error names each difference),
so it draws the same batches and makes the same updates as an uninterrupted run.
torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import PrefixEdgeError

CKPT_FILE = "checkpoint.pt"
CKPT_FORMAT = "prefix-edge-train-checkpoint"
# setting -> how the CLI names it, for "made with different settings" errors
SETTING_FLAGS = {"kind": "--kind", "base": "--base", "virtual_tokens": "--virtual-tokens",
                 "init_text": "--init-text", "template": "--template", "train_data": "--data",
                 "eval_data": "--eval/--held-out", "lr": "--lr", "batch_size": "--batch-size",
                 "seed": "--seed", "steps": "--steps", "eval_every": "--eval-every",
                 "patience": "--patience"}


def _batch(rows, pad_id: int):
    import torch

    n = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (x, y) in enumerate(rows):  # right padding: positions stay 0..len-1 after the prefix
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss_sum(model, batch) -> tuple:
    """(sum of target-token losses, number of target tokens). Logits are computed only from the
    first position that predicts a target token onward (`logits_to_keep`): the vocabulary
    projection is a large part of a small model's cost. Counting from the end also skips the
    virtual positions that PEFT's prompt tuning and P-tuning prepend."""
    import torch.nn.functional as F

    labels = batch["labels"]
    n = labels.shape[1]
    first = int((labels != -100).float().argmax(dim=1).min())  # earliest target token in the batch
    keep = n - max(first - 1, 0)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   logits_to_keep=keep).logits[:, -keep:, :]
    targets = labels[:, n - keep + 1:]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, int((targets != -100).sum())


def held_out_loss(model, rows, pad_id: int, batch_size: int, advance=lambda: None) -> float | None:
    """Mean loss per target token over `rows` (None without rows)."""
    import torch

    if not rows:
        return None
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(rows), batch_size):
            s, n = _loss_sum(model, _batch(rows[i:i + batch_size], pad_id))
            total, count = total + float(s), count + n
            advance()
    return total / max(count, 1)


@dataclass
class Plan:
    steps: int
    lr: float
    batch_size: int
    seed: int
    eval_every: int | None = None        # held-out loss every K steps (and at the last step)
    patience: int | None = None          # stop after this many evaluations without improvement
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = None
    settings: dict = field(default_factory=dict)  # what a checkpoint records and must match
    resume_from: dict | None = None      # a checkpoint read by `read_checkpoint`
    max_steps_this_run: int | None = None  # stop (as if interrupted) after this many steps


@dataclass
class Outcome:
    losses: list[float]                  # every step's train loss, from step 1
    before: float | None                 # held-out loss before training
    after: float | None                  # held-out loss of the adapter left in the model
    curve: list[list] = field(default_factory=list)  # [[step, held-out loss], ...] with eval_every
    step: int = 0                        # steps run in all (including before a resume)
    best_step: int | None = None
    stopped_early: bool = False
    completed: bool = True               # False: stopped by max_steps_this_run
    resumed_from: int | None = None


@dataclass
class _State:
    rng: random.Random
    step: int = 0
    order: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    curve: list[list] = field(default_factory=list)
    before: float | None = None
    best_step: int | None = None
    best_loss: float | None = None
    best_state: dict | None = None
    bad: int = 0                         # evaluations since the best one


def _copy(encoder) -> dict:
    return {k: v.detach().clone() for k, v in encoder.state_dict().items()}


def fit(model, rows, pad: int, plan: Plan, evaluate: Callable[[str], float | None], bar) -> Outcome:
    """AdamW over the adapter's parameters, linear warm-up (10% of `plan.steps`) then linear decay,
    clipped gradients; batches are drawn from one shuffled pass after another. `evaluate(label)`
    gives the held-out loss (it may switch the model to eval mode). With `eval_every`, the best
    evaluated state (step 0 included) is loaded back into the model at the end."""
    import torch

    encoder = model.prompt_encoder[model.active_adapter]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=plan.lr, weight_decay=0.0)
    warmup, steps = max(1, plan.steps // 10), plan.steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    st = _State(random.Random(plan.seed))
    if plan.resume_from is not None:
        _restore(plan.resume_from, st, encoder, opt, sched)
    else:
        st.before = evaluate("before")
        if plan.eval_every:
            st.curve, st.best_step, st.best_loss, st.best_state = [[0, st.before]], 0, st.before, _copy(encoder)
    start = st.step
    task = bar.add_task("train", total=steps, completed=start, info="")
    stopped = False
    model.train()
    while st.step < steps:
        if plan.max_steps_this_run is not None and st.step - start >= plan.max_steps_this_run:
            return Outcome(st.losses, st.before, None, st.curve, st.step, st.best_step,
                           completed=False, resumed_from=start or None)
        if len(st.order) < plan.batch_size:
            st.order += st.rng.sample(range(len(rows)), len(rows))
        batch, st.order = [rows[i] for i in st.order[:plan.batch_size]], st.order[plan.batch_size:]
        s, n = _loss_sum(model, _batch(batch, pad))
        loss = s / max(n, 1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        st.step += 1
        st.losses.append(loss.item())
        info = f"loss {_mean(st.losses[-10:]):.4f}"
        if plan.eval_every and (st.step % plan.eval_every == 0 or st.step == steps):
            held = evaluate(f"step {st.step}")
            model.train()
            st.curve.append([st.step, held])
            if held < st.best_loss:
                st.best_step, st.best_loss, st.best_state, st.bad = st.step, held, _copy(encoder), 0
            else:
                st.bad += 1
            info += f", held-out {held:.4f} (best {st.best_loss:.4f} at step {st.best_step})"
            stopped = bool(plan.patience) and st.bad >= plan.patience and st.step < steps
        bar.update(task, completed=st.step, info=info)
        if stopped:
            break
        if plan.checkpoint_every and st.step % plan.checkpoint_every == 0 and st.step < steps:
            save_checkpoint(plan, st, encoder, opt, sched)
    if st.best_state is not None:
        encoder.load_state_dict(st.best_state)
        after = st.best_loss
    else:
        after = evaluate("after")
    return Outcome(st.losses, st.before, after, st.curve, st.step, st.best_step, stopped,
                   resumed_from=start or None)


# --- checkpoints --------------------------------------------------------------------------------

def save_checkpoint(plan: Plan, st: _State, encoder, opt, sched) -> None:
    import torch

    d = Path(plan.checkpoint_dir)
    d.mkdir(parents=True, exist_ok=True)
    state = {"format": CKPT_FORMAT, "version": 1, "settings": json.dumps(plan.settings, sort_keys=True),
             "step": st.step, "adapter": _copy(encoder), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "torch_rng": torch.get_rng_state(),
             "data_rng": st.rng.getstate(), "order": list(st.order), "losses": list(st.losses),
             "curve": [list(c) for c in st.curve], "before": st.before, "best_step": st.best_step,
             "best_loss": st.best_loss, "best_state": st.best_state, "bad": st.bad}
    tmp = d / f".{CKPT_FILE}.tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / CKPT_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_checkpoint(d: Path, settings: dict) -> dict:
    """The checkpoint in `d`, refused (one line naming each difference) unless it was made with
    `settings`."""
    import torch

    path = Path(d) / CKPT_FILE
    if not path.is_file():
        raise PrefixEdgeError(f"--resume: no checkpoint to resume from ({path} does not exist)")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if ck.get("format") != CKPT_FORMAT:
            raise ValueError("not a prefix-edge train checkpoint")
        theirs = json.loads(ck["settings"])
    except Exception as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrefixEdgeError(f"{path}: cannot read the checkpoint ({why})") from None
    keys = list(SETTING_FLAGS) + sorted((set(theirs) | set(settings)) - set(SETTING_FLAGS))
    diffs = [f"{SETTING_FLAGS.get(k, k)} {_show(theirs.get(k))} there, {_show(settings.get(k))} now"
             for k in keys if theirs.get(k) != settings.get(k)]
    if diffs:
        raise PrefixEdgeError(f"checkpoint {Path(d)} was made with other settings: {'; '.join(diffs)} "
                              f"(rerun with the same settings, or remove {Path(d)} to start over)")
    return ck


def _show(v: Any) -> str:
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return f"sha256 {v[:12]}…"
    return json.dumps(v, ensure_ascii=False) if isinstance(v, str) or v is None else str(v)


def _restore(ck: dict, st: _State, encoder, opt, sched) -> None:
    import torch

    encoder.load_state_dict(ck["adapter"])
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    torch.set_rng_state(ck["torch_rng"])
    st.rng.setstate(ck["data_rng"])
    st.step, st.order, st.losses, st.curve = ck["step"], list(ck["order"]), list(ck["losses"]), list(ck["curve"])
    st.before, st.best_step, st.best_loss = ck["before"], ck["best_step"], ck["best_loss"]
    st.best_state, st.bad = ck["best_state"], ck["bad"]


def remove_checkpoint(d: Path) -> None:
    """Delete the checkpoint file, and the dir if nothing else is in it."""
    d = Path(d)
    for name in (CKPT_FILE, f".{CKPT_FILE}.tmp"):
        (d / name).unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:
        pass


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
