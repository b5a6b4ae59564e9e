"""`prefix-edge train`: train a PEFT prompt-learning adapter (prefix tuning or prompt tuning) on
CPU from `{"input", "output"}` JSONL lines.

What the adapter is trained on is exactly what a `kind = "peft"`, `chat = false` task feeds it:
the prompt is `template` with `{input}` replaced once, tokenized on its own without added special
tokens; the target is the output followed by the model's EOS token, tokenized the same way. The
loss covers only the target tokens. The prompt is tokenized separately from the target (not as one
string) so that its ids are the ids the runtime will see.

The result is a plain PEFT adapter dir (adapter_config.json + adapter_model.safetensors, loadable
with `PeftModel.from_pretrained`) plus `prefix_edge_train.json` (template, data hashes, settings,
losses, timings). torch, transformers and peft are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import PrefixEdgeError

KINDS = {"prefix": "PREFIX_TUNING", "prompt": "PROMPT_TUNING"}
DEFAULT_LR = {"prefix": 1e-2, "prompt": 3e-2}  # the demo task (order_json) trained well at 1e-2
DEFAULT_HELD_OUT = 0.1
INFO_FILE = "prefix_edge_train.json"


@dataclass
class Example:
    input: str
    output: str


def read_jsonl(path: Path) -> list[Example]:
    """Read `{"input": str, "output": str}` lines; blank lines are skipped. Errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise PrefixEdgeError(f"{path}: no such data file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PrefixEdgeError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PrefixEdgeError(f"{path}:{no}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise PrefixEdgeError(f"{path}:{no}: expected an object with keys 'input' and 'output'")
        for key in ("input", "output"):
            if key not in row:
                raise PrefixEdgeError(f"{path}:{no}: missing key '{key}'")
            if not isinstance(row[key], str):
                raise PrefixEdgeError(f"{path}:{no}: '{key}' must be a string")
        out.append(Example(row["input"], row["output"]))
    if not out:
        raise PrefixEdgeError(f"{path}: no examples")
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _check_args(kind, virtual_tokens, steps, batch_size, lr, template, held_out) -> None:
    if kind not in KINDS:
        raise PrefixEdgeError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if virtual_tokens < 1:
        raise PrefixEdgeError(f"--virtual-tokens must be at least 1, not {virtual_tokens}")
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
    virtual positions that PEFT's prompt tuning prepends."""
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


def text_kv_init(model, ids: list[int], n: int):
    """A prefix-tuning embedding [n, 2L*kv_heads*head_dim] equal to the KV cache of `ids` (cycled
    or cut to n tokens): at step 0 the adapter behaves exactly like that text as a prefix."""
    import torch

    ids = (ids * math.ceil(n / len(ids)))[:n]
    with torch.no_grad():
        cache = model(torch.tensor([ids]), use_cache=True).past_key_values
    rows = []
    for layer in range(model.config.num_hidden_layers):
        k, v = cache[layer][0][0], cache[layer][1][0]  # [kv_heads, n, head_dim]
        rows += [k.permute(1, 0, 2), v.permute(1, 0, 2)]  # PEFT: key = 2l, value = 2l+1
    return torch.stack(rows, dim=1).reshape(n, -1)


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


def _load(base: Path, work: Path, kind: str, n: int, init_text: str | None, seed: int):
    """(tokenizer, PEFT model ready to train, EOS id) for `base` (an HF dir or a .gguf)."""
    import torch
    from peft import PrefixTuningConfig, PromptTuningConfig, PromptTuningInit, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from .source import prepare_hf_dir

    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    hf_dir = prepare_hf_dir(base, work)
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    eos = model.config.eos_token_id  # the model's own end of turn: a GGUF's tokenizer may say otherwise
    eos = (eos[0] if isinstance(eos, list) else eos) if eos is not None else tok.eos_token_id
    if eos is None:
        raise PrefixEdgeError(f"{base}: neither the model config nor the tokenizer names an EOS token")
    if kind == "prefix":
        cfg = PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=n)
    else:
        cfg = PromptTuningConfig(
            task_type="CAUSAL_LM", num_virtual_tokens=n,
            prompt_tuning_init=PromptTuningInit.TEXT if init_text else PromptTuningInit.SAMPLE_VOCAB,
            prompt_tuning_init_text=init_text, tokenizer_name_or_path=str(hf_dir) if init_text else None)
    init = None
    if kind == "prefix" and init_text:
        ids = tok(init_text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise PrefixEdgeError("--init-text has no tokens")
        init = text_kv_init(model, ids, n)
    peft_model = get_peft_model(model, cfg)
    if init is not None:
        peft_model.prompt_encoder["default"].embedding.weight.data.copy_(init)
    return tok, peft_model, eos


def _fit(peft_model, rows, pad: int, steps: int, lr: float, batch_size: int, seed: int, bar) -> list[float]:
    """AdamW over the adapter's parameters, linear warm-up (10%) then linear decay, clipped
    gradients; batches are drawn from one shuffled pass after another. Returns the step losses."""
    import torch

    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))))
    rng, order, losses = random.Random(seed), [], []
    task = bar.add_task("train", total=steps, info="")
    peft_model.train()
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.sample(range(len(rows)), len(rows))
        batch, order = [rows[i] for i in order[:batch_size]], order[batch_size:]
        s, n = _loss_sum(peft_model, _batch(batch, pad))
        loss = s / max(n, 1)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.update(task, advance=1, info=f"loss {_mean(losses[-10:]):.4f}")
    return losses


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                    console=Console(stderr=True), disable=not enabled)


def train_adapter(base: Path | None, data: Path, out: Path, *, kind: str = "prefix", virtual_tokens: int = 16,
                  steps: int = 100, lr: float | None = None, init_text: str | None = None,
                  template: str = "{input}", batch_size: int = 8, seed: int = 0,
                  held_out: float | None = None, eval_data: Path | None = None, force: bool = False,
                  progress: bool = True) -> dict:
    """Train an adapter into `out` (written atomically); returns what prefix_edge_train.json holds."""
    _check_args(kind, virtual_tokens, steps, batch_size, lr, template, held_out)
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
    if base is None:
        from .source import default_model_path
        base = default_model_path()
    base = Path(base)
    if not base.exists():
        raise PrefixEdgeError(f"{base}: no such model file or directory")
    lr = DEFAULT_LR[kind] if lr is None else lr

    t_start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prefix-edge-train-") as work, _progress(progress) as bar:
        t_load = bar.add_task("load model", total=1, info="")
        tok, peft_model, eos = _load(base, Path(work), kind, virtual_tokens, init_text, seed)
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        train_enc = [encode(tok, template, ex, eos) for ex in train_rows]
        eval_enc = [encode(tok, template, ex, eos) for ex in eval_rows]
        bar.update(t_load, completed=1)
        load_s = time.perf_counter() - t_start

        def held_out(label):
            t = bar.add_task(f"held-out loss ({label})", total=math.ceil(len(eval_enc) / batch_size), info="")
            peft_model.eval()
            loss = held_out_loss(peft_model, eval_enc, pad, batch_size, lambda: bar.advance(t))
            bar.update(t, info="" if loss is None else f"{loss:.4f}")
            return loss

        before = held_out("before")
        t_train = time.perf_counter()
        losses = _fit(peft_model, train_enc, pad, steps, lr, batch_size, seed, bar)
        train_s = time.perf_counter() - t_train
        after = held_out("after")
        # the adapter names the base as the bundle manifest does (model.source), not a temp dir
        peft_model.peft_config["default"].base_model_name_or_path = base.name
        if kind == "prompt" and init_text:
            peft_model.peft_config["default"].tokenizer_name_or_path = base.name
        info = {
            "format": "prefix-edge-train", "version": 1, "kind": kind, "peft_type": KINDS[kind],
            "base": base.name, "template": template, "eos_token_id": eos,
            "eos_token": tok.convert_ids_to_tokens(eos), "virtual_tokens": virtual_tokens,
            "init_text": init_text, "steps": steps, "lr": lr, "batch_size": batch_size, "seed": seed,
            "data": {"train": {"file": Path(data).name, "sha256": _sha256(data), "examples": len(train_enc)},
                     "eval": eval_desc | {"examples": len(eval_enc)}},
            "loss": {"held_out_before": before, "held_out_after": after,
                     "train_first10": _mean(losses[:10]), "train_last10": _mean(losses[-10:])},
            "time_s": {"load": round(load_s, 1), "train": round(train_s, 1),
                       "total": round(time.perf_counter() - t_start, 1)},
            "versions": _versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _save(peft_model, out, info)
    return info


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _versions() -> dict:
    import peft
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
