"""speculative="mtp" at the sizes people run: random-weight Qwen3.5 checkpoints with an MTP head
(Qwen3.5-0.8B's published text config, and the same architecture at SmolLM2-135M's width),
exported as a user would (GGUF Q4_1 through llama.cpp's converter, which keeps the head), then
greedy answers with speculative "off" and "mtp" on one slot.

Random weights give real forward costs but not real acceptance: a random head's drafts are
almost never what a random model writes. So each shape runs with two heads:
- "random": the head as initialised (acceptance ~0): what drafting costs when it does not pay
  (the pause after rejected drafts bounds it);
- "agreeing": the model's layers other than its last attention layer zeroed (they still run:
  same cost), its embedding rows scaled to one RMS, the head a copy of that layer reading the
  token's embedding (tests/helpers/families.py build_qwen3_5_mtp at scale): every draft is
  the model's own next token, the upper bound of what a head can give at these forward costs.
Real acceptance needs real weights (Qwen3.5's published head): not measured here.

Per shape and head, in rounds of the three (a fresh runtime each, medians over the rounds):
decode tok/s with "off" (a runtime without the head) and "mtp", their
ratio, tokens per forward (generated / (generated - accepted)), drafted and accepted tokens,
"off" with the head loaded (its cost when unused: the hidden states read out, the recurrent
state's snapshots), and one head step against one model step (ms).

    python benchmarks/mtp_drafting.py [--shapes qwen3.5-135m,qwen3.5-0.8b] [--work DIR]
                                      [--out docs/mtp-drafting.json] [--tokens 64] [--threads 2]
                                      [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from models_at_scale import CONFIGS, CONTEXT, grow_tokenizer  # noqa: E402

SHAPES = {
    "qwen3.5-0.8b": CONFIGS["qwen3.5-0.8b"],
    # the same architecture at SmolLM2-135M's width and vocabulary: 24 layers (18 Gated DeltaNet,
    # 6 gated attention), hidden 576, 151M parameters with the embeddings
    "qwen3.5-135m": {**CONFIGS["qwen3.5-0.8b"], "hidden_size": 576, "intermediate_size": 1536,
                     "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128,
                     "linear_num_key_heads": 8, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
                     "linear_value_head_dim": 64, "vocab_size": 49152},
}
TASKS = '''
[task.raw]
kind = "text"
prefix = "Notes from the support desk, one line each.\\n"
template = "{input}"
max_tokens = 64
'''
INPUTS = ["The customer asked about the storage plan and", "Billing for the family plan changed in",
          "To sync a second device, open the settings and"]


def build(shape: str, head: str, out: Path, tokenizer_dir: Path) -> Path:
    """A random-weight checkpoint of `shape` with an MTP head ("random" or "agreeing")."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    if (out / "config.json").is_file():
        return out
    cfg = {**SHAPES[shape], "max_position_embeddings": CONTEXT, "mtp_num_hidden_layers": 1}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16", "bos_token_id": 1,
                                                 "eos_token_id": 2, "pad_token_id": 2}))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out)), dtype=torch.float32)
    model.save_pretrained(str(out))
    sd = load_file(str(out / "model.safetensors"))
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    last = max(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    gen = torch.Generator().manual_seed(1)
    if head == "agreeing":
        c = 0.1
        emb = sd["model.embed_tokens.weight"]
        sd["model.embed_tokens.weight"] = c * emb / emb.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-8)
        for k in list(sd):
            if k.startswith("model.layers.") and int(k.split(".")[2]) != last and \
                    k.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
                sd[k] = torch.zeros_like(sd[k])
        fc = torch.zeros(h, 2 * h)
        fc[:, :h] = c * torch.eye(h)
    else:
        fc = 0.02 * torch.randn(h, 2 * h, generator=gen)
    for k, v in list(sd.items()):
        if k.startswith(f"model.layers.{last}."):
            w = v.clone()
            if head == "random" and w.dim() == 2:
                w = 0.02 * torch.randn(w.shape, generator=gen)
            sd["mtp.layers.0." + k[len(f"model.layers.{last}."):]] = w
    sd["mtp.fc.weight"] = fc
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        sd[f"mtp.{name}.weight"] = torch.zeros(h)
    sd["mtp.norm.weight"] = sd["model.norm.weight"].clone()
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    grow_tokenizer(tokenizer_dir, out, cfg["vocab_size"])
    del n
    return out


def step_costs(rt, runs: int = 20) -> dict:
    """One model step and one head step (a draft of one token) on the engine, ms (medians)."""
    import numpy as np

    be = rt.backend
    ids = be.tokenize(INPUTS[0])
    be.seq_restore(0, None)
    be.forward([(0, 0, ids)])
    pos, model_ms, head_ms = len(ids), [], []
    for i in range(runs):
        t = time.perf_counter()
        be.forward([(0, pos, np.array([ids[i % len(ids)]]))])
        model_ms.append((time.perf_counter() - t) * 1e3)
        pos += 1
        t = time.perf_counter()
        be.mtp_draft(0, int(ids[(i + 1) % len(ids)]), pos, 1)
        head_ms.append((time.perf_counter() - t) * 1e3)
    be.seq_free(0)
    return {"model_step_ms": round(float(np.median(model_ms)), 2),
            "head_step_ms": round(float(np.median(head_ms)), 2)}


def answers(bundle: Path, spec: str, mtp_head: bool, threads: int, tokens: int) -> dict:
    """Greedy answers to INPUTS in a fresh runtime, one at a time after a warm-up."""
    from prefix_edge import Runtime

    with Runtime.open(bundle, backend="gguf", slots=1, threads=threads, mtp_head=mtp_head) as rt:
        rt.generate("raw", INPUTS[0], temperature=0.0, max_tokens=4, speculative=spec)  # warm
        out = [rt.generate("raw", t, temperature=0.0, max_tokens=tokens, speculative=spec) for t in INPUTS]
        costs = step_costs(rt) if mtp_head else {}
    gen = sum(r.stats.generated_tokens for r in out)
    acc = sum(r.stats.accepted_tokens for r in out)
    secs = sum(r.stats.generated_tokens / r.stats.decode_tok_s for r in out if r.stats.decode_tok_s)
    return {"texts": [r.text for r in out], "generated": gen, "drafted": sum(r.stats.drafted_tokens for r in out),
            "accepted": acc, "decode_tok_s": round(gen / secs, 2), "tokens_per_forward": round(gen / max(1, gen - acc), 3),
            **costs}


def rounds(bundle: Path, threads: int, tokens: int, runs: int) -> dict:
    """"off", "off" with the head loaded and "mtp", interleaved round by round (the machine's
    drift falls on all three alike); each one's decode tok/s the median of its rounds."""
    import statistics

    configs = {"off": ("off", False), "off_head_loaded": ("off", True), "mtp": ("mtp", True)}
    seen: dict[str, list[dict]] = {k: [] for k in configs}
    for _ in range(runs):
        for k, (spec, head) in configs.items():
            seen[k].append(answers(bundle, spec, head, threads, tokens))
    out = {}
    for k, rs in seen.items():
        out[k] = {**rs[0], "decode_tok_s": round(statistics.median(r["decode_tok_s"] for r in rs), 2),
                  "decode_tok_s_rounds": [r["decode_tok_s"] for r in rs]}
        for c in ("model_step_ms", "head_step_ms"):
            if c in rs[0]:
                out[k][c] = round(statistics.median(r[c] for r in rs), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3.5-135m,qwen3.5-0.8b")
    ap.add_argument("--heads", default="random,agreeing")
    ap.add_argument("--work", default="/tmp/prefix-edge-mtp")
    ap.add_argument("--out", default="docs/mtp-drafting.json")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="rounds of the three configurations, interleaved")
    a = ap.parse_args()
    from prefix_edge.paths import default_bundle

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    (work / "tasks.toml").write_text(TASKS)
    report = {"date": time.strftime("%Y-%m-%d"), "threads": a.threads, "tokens": a.tokens, "runs": {}}
    for shape in a.shapes.split(","):
        for head in a.heads.split(","):
            name = f"{shape}/{head}"
            hf = build(shape, head, work / shape / head / "hf", default_bundle() / "tokenizer")
            bundle = work / shape / head / "bundle"
            if not (bundle / "manifest.json").is_file():
                subprocess.run([sys.executable, "-m", "prefix_edge", "export", str(hf), "--tasks",
                                str(work / "tasks.toml"), "--out", str(bundle), "--gguf-quant", "q4_1",
                                "--format", "gguf", "--force"], check=True)
            got = rounds(bundle, a.threads, a.tokens, a.runs)
            off, off_loaded, mtp = got["off"], got["off_head_loaded"], got["mtp"]
            report["runs"][name] = {
                "off": off, "off_head_loaded": off_loaded, "mtp": mtp,
                "answers_equal": mtp["texts"] == off["texts"],
                "decode_ratio": round(mtp["decode_tok_s"] / off["decode_tok_s"], 3),
                "head_loaded_ratio": round(off_loaded["decode_tok_s"] / off["decode_tok_s"], 3),
                "gguf_bytes": sum(p.stat().st_size for p in (bundle / "gguf").glob("*"))}
            Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
            r = report["runs"][name]
            print(f"{name}: off {off['decode_tok_s']} tok/s, mtp {mtp['decode_tok_s']} tok/s "
                  f"(x{r['decode_ratio']}), {mtp['tokens_per_forward']} tokens/forward, "
                  f"{mtp['accepted']}/{mtp['drafted']} kept, head loaded x{r['head_loaded_ratio']}, "
                  f"step {mtp.get('model_step_ms')} ms vs head {mtp.get('head_step_ms')} ms, equal {r['answers_equal']}",
                  flush=True)


if __name__ == "__main__":
    main()
