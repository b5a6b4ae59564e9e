"""`prefix-edge train`: train a PEFT prompt-learning adapter (prefix tuning, prompt tuning,
P-tuning or a cartridge) on CPU from `{"input", "output"}` JSONL lines.

What the adapter is trained on is exactly what a `kind = "peft"`, `chat = false` task feeds it:
the prompt is `template` with `{input}` replaced once, tokenized on its own without added special
tokens; the target is the output followed by the model's EOS token, tokenized the same way. The
loss covers only the target tokens. The prompt is tokenized separately from the target (not as one
string) so that its ids are the ids the runtime will see.

Kinds: `prefix` (PREFIX_TUNING, no projection: the KV itself is trained), `cartridge` (CARTRIDGE:
also the KV itself, its first virtual token frozen as an attention sink, PEFT's default),
`prompt` (PROMPT_TUNING: input embeddings) and `p-tuning` (P_TUNING: input embeddings produced by
PEFT's MLP prompt encoder; saved, the adapter holds the encoder's output). `--init-text` starts
prefix and cartridge from that text's KV cache (the adapter then behaves exactly like the text as
a prefix), prompt tuning from its token embeddings; P-tuning has no text initialisation.

With `eval_every` the held-out loss is measured every K steps (and at step 0 and the last step)
and the adapter written is the state with the best held-out loss; `patience` stops after that
many evaluations without improvement. `checkpoint_every` writes a resumable checkpoint (see
train_loop.py); `resume` continues from it to the same adapter an uninterrupted run writes.

The result is a plain PEFT adapter dir (adapter_config.json + adapter_model.safetensors, loadable
with `PeftModel.from_pretrained`) plus `prefix_edge_train.json` (template, data hashes, settings,
losses, held-out curve, timings). torch, transformers and peft are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from pathlib import Path

from ..tasks.datafile import Example, read_jsonl
from ..errors import PrefixEdgeError
from ..progress import bars
from .train_loop import CKPT_FILE, Plan, fit, held_out_loss, read_checkpoint, remove_checkpoint

KINDS = {"prefix": "PREFIX_TUNING", "prompt": "PROMPT_TUNING", "p-tuning": "P_TUNING",
         "cartridge": "CARTRIDGE"}
# the demo task (order_json) trained well with prefix tuning at 1e-2; a cartridge is the same
# parameters (the KV itself). P-tuning trains an MLP whose output is the embeddings: a lower rate.
DEFAULT_LR = {"prefix": 1e-2, "cartridge": 1e-2, "prompt": 3e-2, "p-tuning": 1e-3}
DEFAULT_HELD_OUT = 0.1
INFO_FILE = "prefix_edge_train.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _check_args(kind, virtual_tokens, steps, batch_size, lr, template, held_out, init_text) -> None:
    if kind not in KINDS:
        raise PrefixEdgeError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if virtual_tokens < 1:
        raise PrefixEdgeError(f"--virtual-tokens must be at least 1, not {virtual_tokens}")
    if kind == "cartridge" and virtual_tokens < 2:
        raise PrefixEdgeError("--kind cartridge needs --virtual-tokens of at least 2 (its first virtual "
                              "token stays frozen as an attention sink)")
    if kind == "p-tuning" and init_text is not None:
        raise PrefixEdgeError("--init-text does not apply to --kind p-tuning (PEFT's P-tuning has no "
                              "text initialisation); use --kind prompt for a text-initialised soft prompt")
    if steps < 1 or batch_size < 1:
        raise PrefixEdgeError("--steps and --batch-size must be at least 1")
    if lr is not None and not lr > 0:
        raise PrefixEdgeError(f"--lr must be positive, not {lr}")
    if template.count("{input}") != 1:
        raise PrefixEdgeError("--template must contain '{input}' exactly once")
    if held_out is not None and not 0 <= held_out < 1:
        raise PrefixEdgeError(f"--held-out must be a fraction in [0, 1), not {held_out}")


def encode(tok, template: str, ex: Example, eos_id: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels): the filled template then output + EOS; labels -100 on the prompt."""
    prompt = tok(template.replace("{input}", ex.input, 1), add_special_tokens=False)["input_ids"]
    target = tok(ex.output, add_special_tokens=False)["input_ids"] + [eos_id]
    return prompt + target, [-100] * len(prompt) + target


def text_kv_cache(model, ids: list[int], n: int):
    """The base model's KV cache (`past_key_values`) of `ids` cycled or cut to n tokens. Loaded into
    a prefix-tuning or cartridge adapter (PEFT's `initialize_kv_prefix_from_past_key_values`), the
    adapter behaves at step 0 exactly like that text as a prefix."""
    import torch

    ids = (ids * math.ceil(n / len(ids)))[:n]
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=True).past_key_values


def _split(data: Path, eval_data: Path | None, held_out: float | None, seed: int):
    """(train rows, held-out rows, how the held-out set was made) from --data and --eval/--held-out."""
    rows = read_jsonl(data)
    if eval_data is not None:
        return rows, read_jsonl(eval_data), {"file": Path(eval_data).name, "sha256": _sha256(eval_data)}
    frac = DEFAULT_HELD_OUT if held_out is None else held_out
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    k = min(len(order) - 1, max(1, round(frac * len(order)))) if frac > 0 else 0
    return ([rows[i] for i in sorted(order[k:])], [rows[i] for i in sorted(order[:k])],
            {"held_out_from_train": frac})


def _save(peft_model, out: Path, info: dict) -> None:
    """Write the adapter + INFO_FILE into a temporary dir next to `out`, then rename it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        peft_model.save_pretrained(str(tmp), save_embedding_layers=False)  # (no Hub look-up)
        (tmp / "README.md").unlink(missing_ok=True)  # PEFT's empty model-card template
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp and safetensors make them private; these are ordinary outputs
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _peft_config(kind: str, n: int, init_text: str | None, hf_dir: Path):
    from peft import (CartridgeConfig, PrefixTuningConfig, PromptEncoderConfig,
                      PromptEncoderReparameterizationType, PromptTuningConfig, PromptTuningInit)

    if kind == "prefix":
        return PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=n)
    if kind == "cartridge":
        return CartridgeConfig(task_type="CAUSAL_LM", num_virtual_tokens=n, num_frozen_tokens=1)
    if kind == "p-tuning":
        return PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=n,
                                   encoder_reparameterization_type=PromptEncoderReparameterizationType.MLP)
    return PromptTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=n,
        prompt_tuning_init=PromptTuningInit.TEXT if init_text else PromptTuningInit.SAMPLE_VOCAB,
        prompt_tuning_init_text=init_text, tokenizer_name_or_path=str(hf_dir) if init_text else None)


def _load(base: Path, work: Path, kind: str, n: int, init_text: str | None, seed: int):
    """(tokenizer, PEFT model ready to train, EOS id) for `base` (an HF dir or a .gguf)."""
    import torch
    from peft import get_peft_model, initialize_kv_prefix_from_past_key_values
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..export.source import prepare_hf_dir

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    hf_dir = prepare_hf_dir(base, work)
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    eos = model.config.eos_token_id  # the model's own end of turn: a GGUF's tokenizer may say otherwise
    eos = (eos[0] if isinstance(eos, list) else eos) if eos is not None else tok.eos_token_id
    if eos is None:
        raise PrefixEdgeError(f"{base}: neither the model config nor the tokenizer names an EOS token")
    cfg = _peft_config(kind, n, init_text, hf_dir)
    cache = None
    if kind in ("prefix", "cartridge") and init_text:
        ids = tok(init_text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise PrefixEdgeError("--init-text has no tokens")
        cache = text_kv_cache(model, ids, n)  # of the base model, before PEFT wraps it
    peft_model = get_peft_model(model, cfg)
    if cache is not None:
        initialize_kv_prefix_from_past_key_values(peft_model, past_key_values=cache)
    return tok, peft_model, eos


def _check_loop_args(eval_every, patience, checkpoint_every, checkpoint, resume) -> None:
    for flag, v in (("--eval-every", eval_every), ("--patience", patience),
                    ("--checkpoint-every", checkpoint_every)):
        if v is not None and v < 1:
            raise PrefixEdgeError(f"{flag} must be at least 1, not {v}")
    if checkpoint is not None and checkpoint_every is None and not resume:
        raise PrefixEdgeError("--checkpoint needs --checkpoint-every (to write one) or --resume (to continue one)")


def train_adapter(base: Path | None, data: Path, out: Path, *, kind: str = "prefix", virtual_tokens: int = 16,
                  steps: int = 100, lr: float | None = None, init_text: str | None = None,
                  template: str = "{input}", batch_size: int = 8, seed: int = 0,
                  held_out: float | None = None, eval_data: Path | None = None, force: bool = False,
                  progress: bool = True, eval_every: int | None = None, patience: int | None = None,
                  checkpoint_every: int | None = None, checkpoint: Path | None = None, resume: bool = False,
                  max_steps_this_run: int | None = None) -> dict:
    """Train an adapter into `out` (written atomically); returns what prefix_edge_train.json holds.

    `eval_every`/`patience`: held-out loss every K steps (default with `patience`: steps // 10), best
    state kept, stop after `patience` evaluations without improvement. `checkpoint_every`: write a
    checkpoint to `checkpoint` (default `<out>.ckpt`) every K steps; `resume`: continue from it (same
    settings required). The checkpoint is removed once `out` is written. `max_steps_this_run` (for
    tests) stops as if interrupted after that many steps of this run: nothing is written to `out`
    and `{"completed": False, "steps_run": step, "checkpoint": dir}` is returned."""
    _check_args(kind, virtual_tokens, steps, batch_size, lr, template, held_out, init_text)
    _check_loop_args(eval_every, patience, checkpoint_every, checkpoint, resume)
    if held_out is not None and eval_data is not None:
        raise PrefixEdgeError("give --held-out or --eval, not both")
    out = Path(out)
    if out.exists() and not force and (not out.is_dir() or any(out.iterdir())):
        raise PrefixEdgeError(f"{out} exists; use --force to replace it")
    if out.exists() and (not out.is_dir() or out.is_symlink() or (any(out.iterdir()) and not
                                                                   (out / "adapter_config.json").is_file())):
        raise PrefixEdgeError(f"{out} is not an adapter dir (no adapter_config.json) and not empty: "
                              "--force only replaces adapters")
    train_rows, eval_rows, eval_desc = _split(data, eval_data, held_out, seed)
    if (eval_every or patience) and not eval_rows:
        raise PrefixEdgeError("--eval-every and --patience need held-out examples (--eval FILE or "
                              "--held-out above 0)")
    if patience and eval_every is None:
        eval_every = max(1, steps // 10)
    if base is None:
        from ..export.source import default_model_path
        base = default_model_path()
    base = Path(base)
    if not base.exists():
        raise PrefixEdgeError(f"{base}: no such model file or directory")
    lr = DEFAULT_LR[kind] if lr is None else lr
    train_sha = _sha256(data)
    settings = {"kind": kind, "base": base.name, "virtual_tokens": virtual_tokens, "init_text": init_text,
                "template": template, "train_data": train_sha,
                "eval_data": eval_desc.get("sha256", eval_desc.get("held_out_from_train")), "lr": lr,
                "batch_size": batch_size, "seed": seed, "steps": steps, "eval_every": eval_every,
                "patience": patience}
    ckpt_dir = Path(checkpoint) if checkpoint is not None else out.with_name(out.name + ".ckpt")
    if resume:
        resume_from = read_checkpoint(ckpt_dir, settings)
    elif checkpoint_every and (ckpt_dir / CKPT_FILE).exists():
        raise PrefixEdgeError(f"{ckpt_dir} holds the checkpoint of an unfinished run: add --resume to "
                              "continue it, or remove it to start over")
    else:
        resume_from = None
    plan = Plan(steps, lr, batch_size, seed, eval_every, patience, ckpt_dir, checkpoint_every, settings,
                resume_from, max_steps_this_run)

    t_start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prefix-edge-train-") as work, bars(progress) as bar:
        t_load = bar.add_task("load model", total=1, info="")
        tok, peft_model, eos = _load(base, Path(work), kind, virtual_tokens, init_text, seed)
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        train_enc = [encode(tok, template, ex, eos) for ex in train_rows]
        eval_enc = [encode(tok, template, ex, eos) for ex in eval_rows]
        bar.update(t_load, completed=1)
        load_s = time.perf_counter() - t_start

        eval_s = [0.0]  # held-out evaluation time, not counted as training

        def evaluate(label):
            t0, transient = time.perf_counter(), label.startswith("step")  # periodic: on the train bar
            t = bar.add_task(f"held-out loss ({label})", total=math.ceil(len(eval_enc) / batch_size), info="")
            peft_model.eval()
            loss = held_out_loss(peft_model, eval_enc, pad, batch_size, lambda: bar.advance(t))
            if transient:
                bar.remove_task(t)
            else:
                bar.update(t, info="" if loss is None else f"{loss:.4f}")
            eval_s[0] += time.perf_counter() - t0
            return loss

        t_train = time.perf_counter()
        done = fit(peft_model, train_enc, pad, plan, evaluate, bar)
        train_s = time.perf_counter() - t_train - eval_s[0]
        if not done.completed:
            return {"completed": False, "steps_run": done.step,
                    "checkpoint": str(ckpt_dir) if (ckpt_dir / CKPT_FILE).exists() else None}
        # the adapter names the base as the bundle manifest does (model.source), not a temp dir
        peft_model.peft_config["default"].base_model_name_or_path = base.name
        if kind == "prompt" and init_text:
            peft_model.peft_config["default"].tokenizer_name_or_path = base.name
        losses = done.losses
        info = {
            "format": "prefix-edge-train", "version": 1, "kind": kind, "peft_type": KINDS[kind],
            "base": base.name, "template": template, "eos_token_id": eos,
            "eos_token": tok.convert_ids_to_tokens(eos), "virtual_tokens": virtual_tokens,
            "init_text": init_text, "steps": steps, "steps_run": done.step, "stopped_early": done.stopped_early,
            "best_step": done.best_step, "eval_every": eval_every, "patience": patience,
            "resumed_from_step": done.resumed_from, "lr": lr, "batch_size": batch_size, "seed": seed,
            "data": {"train": {"file": Path(data).name, "sha256": train_sha, "examples": len(train_enc)},
                     "eval": eval_desc | {"examples": len(eval_enc)}},
            "loss": {"held_out_before": done.before, "held_out_after": done.after,
                     "held_out_curve": done.curve,
                     "train_first10": _mean(losses[:10]), "train_last10": _mean(losses[-10:])},
            "time_s": {"load": round(load_s, 1), "train": round(train_s, 1), "held_out": round(eval_s[0], 1),
                       "total": round(time.perf_counter() - t_start, 1)},
            "versions": _versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _save(peft_model, out, info)
    if checkpoint_every or resume:
        remove_checkpoint(ckpt_dir)
    return info


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _versions() -> dict:
    import peft
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
