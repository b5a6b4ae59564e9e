"""Which token score keeps a compressed prefix's answers: measured on the fp32 model.

For each demo text task of an uncompressed default bundle, each scoring rule picks the kept
tokens (export/compress.py `choose`: sinks, the last 16 and special tokens forced, then the best
scored) at ratios 2 and 3; each held-out line's reference answer is then teacher-forced after
the whole prefix and after only the kept tokens (the dropped ones masked, positions kept: what
a compressed prefix computes), and the share of answer tokens whose greedy prediction is the
same is reported. Rules: kvzip-max / kvzip-mean (attention while the model repeats the prefix,
max or mean over layers), h2o (attention received from every later prefix token),
window (the prefix's last 16 tokens' attention: what `export --compress-prefix` uses),
recent (keep the latest tokens, StreamingLLM).

    python benchmarks/compression_scores.py --bundle BUNDLE --out docs/compression-scores.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

TASKS = ("support", "sentiment", "extract", "translate", "tool_call")


def main() -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from prefix_edge.bundle import Bundle
    from prefix_edge.export.compress import REPEAT, WINDOW, choose, crop_to
    from prefix_edge.export.source import default_model_path, prepare_hf_dir
    from prefix_edge.paths import default_tasks_file

    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True, help="an uncompressed export of the default model")
    ap.add_argument("--lines", type=int, default=20)
    ap.add_argument("--out", default="docs/compression-scores.json")
    a = ap.parse_args()
    b = Bundle.open(Path(a.bundle))
    tok = Tokenizer.from_file(str(b.tokenizer_file))
    hf = prepare_hf_dir(default_model_path(), Path(tempfile.mkdtemp()))
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32, attn_implementation="eager").eval()
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}  # as export does
    rep = tok.encode(REPEAT, add_special_tokens=False).ids
    data = default_tasks_file().parent / "data"
    report = {"command": " ".join(sys.argv), "lines": a.lines, "tasks": {}}

    def attention(ids):
        P, rec, self_att, mode = len(ids), [], [], {}

        def hook(_m, _i, out):
            w = out[1][0].float()
            (self_att if mode["v"] == "self" else rec).append(
                w[:, :, :P] if mode["v"] == "self" else w[:, -P:, :P].amax(1))
        hooks = [layer.self_attn.register_forward_hook(hook) for layer in model.model.layers]
        with torch.no_grad():
            mode["v"] = "self"
            cache = model(torch.tensor([ids]), use_cache=True).past_key_values
            mode["v"] = "rec"
            model(torch.tensor([rep + ids]), past_key_values=cache, position_ids=torch.arange(P, 2 * P + len(rep))[None])
            crop_to(cache, P)
        for h in hooks:
            h.remove()
        return torch.stack(rec).numpy(), torch.stack(self_att).numpy(), cache

    for task in TASKS:
        t = b.manifest.tasks[task]
        ids = b.prefix_ids(task).tolist()
        P = len(ids)
        rec, sa, cache = attention(ids)
        rules = {"kvzip-max": rec.max(axis=(0, 1)), "kvzip-mean": rec.max(axis=1).mean(0),
                 "h2o": sa.sum(axis=2).mean(axis=(0, 1)) / (P - np.arange(P)),
                 "window": sa[:, :, -WINDOW:, :].max(axis=2).mean(axis=(0, 1)),
                 "recent": np.arange(P, dtype=float)}
        rows = [json.loads(line) for line in (data / f"{task}.heldout.jsonl").read_text().splitlines()][:a.lines]
        out = report["tasks"][task] = {"prefix_tokens": P}
        for name, score in rules.items():
            for ratio in (2.0, 3.0):
                keep = torch.zeros(P, dtype=torch.long)
                keep[choose(score, ids, ratio, special)] = 1
                same = total = 0
                for r in rows:
                    answer = tok.encode(r["output"], add_special_tokens=False).ids
                    x = tok.encode(t.input_before + t.template.replace("{input}", r["input"]) + t.input_after,
                                   add_special_tokens=False).ids + answer
                    n, pos = len(x), torch.arange(P, P + len(x))[None]
                    with torch.no_grad():
                        full = model(torch.tensor([x]), past_key_values=cache, position_ids=pos).logits[0].argmax(-1)
                        crop_to(cache, P)
                        mask = torch.cat([keep, torch.ones(n, dtype=torch.long)])[None]
                        got = model(torch.tensor([x]), past_key_values=cache, attention_mask=mask,
                                    position_ids=pos).logits[0].argmax(-1)
                        crop_to(cache, P)
                    k0 = n - len(answer) - 1  # the positions that predict the answer's tokens
                    same += int((got[k0:-1] == full[k0:-1]).sum())
                    total += len(answer)
                out[f"{name}@{ratio:g}"] = round(same / max(total, 1), 3)
                print(task, name, ratio, out[f"{name}@{ratio:g}"], flush=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
