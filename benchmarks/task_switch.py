"""What switching task per request costs: prefix-edge's tasks created at run time (a baked,
verified prefix each) against the alternative users reach for, a LoRA adapter per task on
llama-cpp-python, switched per request — and against no task at all.

    python benchmarks/task_switch.py [--bundle B] [--tasks 4,16,64] [--requests 32]
                                     [--max-tokens 32] [--threads 2] [--ranks 8,16] [--json FILE]

prefix-edge (the bundle's GGUF on llama.cpp, a fresh task store): N tasks created with
Runtime.add_task (distinct system prompts of ~120 tokens), then --requests requests, each a
seeded random task and input, greedy, --max-tokens tokens (EOS held off): one at a time
("single"), and all submitted at once to a runtime of 8 slots ("8 in flight"). Per request:
the task's switch + restore (stats.prefix_load_ms), TTFT, decode tokens/s; beside it the same
requests to the base model with no task (the decode baseline), and with the task's system
prompt prefilled in every request (use_prefix_cache=False: what a runtime without baked
prefixes does: Ollama's SYSTEM, a plain system message).

LoRA (llama-cpp-python's own Llama on the same GGUF and threads): N random adapters of rank r
on every attention and MLP projection (written with gguf-py as llama.cpp's converter writes
them: general.type adapter, <tensor>.lora_a / .lora_b, f16), all loaded; each request sets its
task's adapter (llama_set_adapters_lora: the switch), prefills its input and decodes. Requests
with different adapters cannot share a batch, so "8 in flight" is served one after another on
the one context: its TTFT counts the wait. Random weights: the speed is real, the text is not.

Prints a JSON report (and writes it with --json); docs/task-switch.md shows it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

WORDS = ("storage billing refunds sync devices plans invoices accounts passwords teams folders backups "
         "limits quotas upgrades downgrades receipts orders shipping returns warranty support hours "
         "languages regions outages status updates security privacy exports imports sharing links").split()
INPUTS = ["How do I get a refund?", "My files stopped syncing.", "Can I change my plan?",
          "Where is my invoice?", "Is there an outage today?", "How do I share a folder?"]


def q(xs: list[float], p: float) -> float:
    return round(float(np.percentile(xs, p)), 2) if xs else 0.0


def system_prompt(k: int) -> str:
    rng = random.Random(k)
    topic = " ".join(rng.choice(WORDS) for _ in range(6))
    rules = ". ".join(" ".join(rng.choice(WORDS) for _ in range(9)).capitalize() for _ in range(8))
    return f"You are support agent {k} for {topic}. Answer in two sentences. Rules: {rules}."


def summary(stats: list, wall: float | None = None) -> dict:
    out = {"switch_restore_ms_p50": q([s.prefix_load_ms for s in stats], 50),
           "switch_restore_ms_p95": q([s.prefix_load_ms for s in stats], 95),
           "ttft_ms_p50": q([s.ttft_ms for s in stats], 50), "ttft_ms_p95": q([s.ttft_ms for s in stats], 95),
           "decode_tok_s_p50": q([s.decode_tok_s for s in stats], 50)}
    if wall:
        out["throughput_tok_s"] = round(sum(s.generated_tokens for s in stats) / wall, 2)
    return out


def prefix_edge(args, bundle: Path, store: Path) -> dict:
    from prefix_edge import Runtime

    n_max = max(args.tasks)
    report: dict = {}
    with Runtime.open(bundle, backend="gguf", threads=args.threads, task_store=store, prompt_cache_bytes=0,
                      read_ahead=False) as rt:
        made = []
        for k in range(n_max):
            t = time.perf_counter()
            info = rt.add_task(f"agent{k}", system=system_prompt(k))
            made.append((time.perf_counter() - t) * 1e3)
        report["create_ms_p50"], report["create_ms_p95"] = q(made, 50), q(made, 95)
        report["prefix_tokens"] = info["prefix_tokens"]
        report["prefix_bytes"] = info["bytes"]
    eos = {str(t): -100.0 for t in rt.manifest.model.eos_token_ids}
    kw = {"max_tokens": args.max_tokens, "temperature": 0.0, "logit_bias": eos}
    for slots, mode in ((1, "single"), (8, "8 in flight")):
        with Runtime.open(bundle, backend="gguf", threads=args.threads, slots=slots, task_store=store,
                          prompt_cache_bytes=0, read_ahead=False) as rt:
            rt.generate(None, messages=[{"role": "user", "content": "hi"}], max_tokens=2)  # warm
            for n in [None, *args.tasks, "prefilled"]:
                rng = random.Random(52)
                calls = [(f"agent{rng.randrange(n if isinstance(n, int) else 4)}" if n else None,
                          rng.choice(INPUTS)) for _ in range(args.requests)]
                extra = {"use_prefix_cache": False} if n == "prefilled" else {}
                t0 = time.perf_counter()
                if slots == 1:
                    stats = [rt.generate(task, messages=[{"role": "user", "content": text}], **kw, **extra).stats
                             for task, text in calls]
                else:
                    streams = [rt.stream(task, messages=[{"role": "user", "content": text}], **kw, **extra)
                               for task, text in calls[:slots]]
                    stats, pending = [], list(calls[slots:])
                    while streams:  # keep 8 in flight until all are done
                        s = streams.pop(0)
                        stats.append(s.wait().stats)
                        if pending:
                            task, text = pending.pop(0)
                            streams.append(rt.stream(task, messages=[{"role": "user", "content": text}], **kw, **extra))
                wall = time.perf_counter() - t0
                label = "no task" if n is None else ("4 tasks, system prompt prefilled per request" if n == "prefilled"
                                                     else f"{n} tasks")
                report[f"{mode}: {label}"] = summary(stats, wall)
    return report


def write_lora(path: Path, base, rank: int, seed: int) -> None:
    """A random LoRA adapter of `rank` on every attention and MLP projection of `base` (a
    gguf.GGUFReader), in llama.cpp's adapter format."""
    import gguf

    arch = bytes(base.fields["general.architecture"].parts[-1]).decode()
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(rank))
    targets = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    for t in base.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in targets and parts[3] == "weight":
            n_in, n_out = int(t.shape[0]), int(t.shape[1])
            w.add_tensor(t.name + ".lora_a", (rng.standard_normal((rank, n_in)) * 0.02).astype(np.float16))
            w.add_tensor(t.name + ".lora_b", (rng.standard_normal((n_out, rank)) * 0.02).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def lora(args, model: Path, work: Path) -> dict:
    import gguf
    import llama_cpp
    from llama_cpp import Llama

    base = gguf.GGUFReader(str(model))
    llm = Llama(model_path=str(model), n_threads=args.threads, n_threads_batch=args.threads, n_ctx=2048,
                verbose=False)
    eos = set(int(x) for x in (llm.token_eos(),))
    prompts = {text: llm.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n".encode(),
                                  add_bos=False, special=True) for text in INPUTS}
    report: dict = {}
    # EOS held off, as prefix-edge's logit_bias does (a Python processor: in every run here,
    # adapter or not, so the decode tax is this section's own ratio)
    no_eos = llama_cpp.LogitsProcessorList([lambda ids, scores: _no_eos(scores, eos)])

    def run(adapter, text: str, t_start: float | None = None) -> dict:
        t0 = time.perf_counter()
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter) if adapter is not None else None
        llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, 1 if adapter is not None else 0,
                                          (ctypes.c_float * 1)(1.0) if adapter is not None else None)
        switch = (time.perf_counter() - t0) * 1e3
        llm.reset()
        first = last = None
        n = 0
        for tok in llm.generate(prompts[text], top_k=1, temp=0.0, reset=True, logits_processor=no_eos):
            n += 1
            last = time.perf_counter()
            if first is None:
                first = last
            if n == args.max_tokens:
                break
        since = t_start if t_start is not None else t0
        return {"switch_ms": switch, "ttft_ms": (first - since) * 1e3,
                "tok_s": (n - 1) / (last - first) if n > 1 else 0.0, "tokens": n}

    def rows(name: str, got: list[dict], wall: float) -> None:
        report[name] = {"switch_ms_p50": q([g["switch_ms"] for g in got], 50),
                        "switch_ms_p95": q([g["switch_ms"] for g in got], 95),
                        "ttft_ms_p50": q([g["ttft_ms"] for g in got], 50),
                        "ttft_ms_p95": q([g["ttft_ms"] for g in got], 95),
                        "decode_tok_s_p50": q([g["tok_s"] for g in got], 50),
                        "throughput_tok_s": round(sum(g["tokens"] for g in got) / wall, 2)}

    run(None, INPUTS[0])  # warm
    rng = random.Random(52)
    texts = [rng.choice(INPUTS) for _ in range(args.requests)]
    t0 = time.perf_counter()
    rows("single: no adapter", [run(None, t) for t in texts], time.perf_counter() - t0)
    for rank in args.ranks:
        adapters = []
        for k in range(max(args.tasks)):
            path = work / f"lora-r{rank}-{k}.gguf"
            write_lora(path, base, rank, k)
            a = llama_cpp.llama_adapter_lora_init(llm._model.model, str(path).encode())
            if not a:
                raise SystemExit(f"llama.cpp refused the adapter {path}")
            adapters.append(a)
        report[f"lora rank {rank} bytes"] = (work / f"lora-r{rank}-0.gguf").stat().st_size
        for n in args.tasks:
            rng = random.Random(52)
            picks = [(adapters[rng.randrange(n)], texts[i]) for i in range(args.requests)]
            t0 = time.perf_counter()
            rows(f"single: rank {rank}, {n} adapters", [run(a, t) for a, t in picks], time.perf_counter() - t0)
            got, t0 = [], time.perf_counter()
            for i in range(0, len(picks), 8):  # 8 arrive together; one context serves them in turn
                start = time.perf_counter()
                got += [run(a, t, start) for a, t in picks[i:i + 8]]
            rows(f"8 in flight: rank {rank}, {n} adapters", got, time.perf_counter() - t0)
        for a in adapters:
            llama_cpp.llama_adapter_lora_free(a)
    return report


def _no_eos(scores, eos):
    for t in eos:
        scores[t] = -np.inf
    return scores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--tasks", default="4,16,64")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ranks", default="8,16")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.tasks = [int(x) for x in args.tasks.split(",")]
    args.ranks = [int(x) for x in args.ranks.split(",")]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.bundle import Bundle
    from prefix_edge.paths import default_bundle

    bundle = Bundle.open(args.bundle or default_bundle())
    with tempfile.TemporaryDirectory(prefix="task-switch-") as tmp:
        work = Path(tmp)
        report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {args.threads} threads",
                  "bundle": bundle.manifest.model.source, "gguf": bundle.backends["gguf"].quantization,
                  "requests": args.requests, "max_tokens": args.max_tokens,
                  "prefix_edge": prefix_edge(args, bundle.root, work / "store"),
                  "llama_cpp_python_lora": lora(args, bundle.model_file("gguf"), work)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
