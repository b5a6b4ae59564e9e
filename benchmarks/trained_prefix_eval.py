"""Held-out score of the trained `order_json` prefix against two untrained baselines.

    python benchmarks/trained_prefix_eval.py [--base MODEL] [--adapter DIR] [--data FILE] [--json OUT]
    python benchmarks/trained_prefix_eval.py --bundle DIR     # the same set through prefix_edge.Runtime

The task (prefix_edge/models/smollm2-135m/make_data.py): a short customer order message → one line of JSON
with exactly the keys name, product, quantity, city. Every way is run with greedy decoding, at most
48 new tokens, stopping at a newline or an EOS token, and the first line of the answer is scored:

  plain         the plain model given only the template-filled input (`Message: ...\\nJSON:\\n`).
  text-raw      the same instructions as a raw text prefix (chat = false): INSTRUCTIONS, a blank
                line, four worked examples in the template's own shape, then the template.
  text-chat     the same instructions as a chat prompt (chat = true): INSTRUCTIONS as the system
                turn, the four examples as user/assistant turns, the input as the next user turn.
  trained       the trained PEFT adapter (PeftModel over the same base) given the template-filled
                input, exactly as it was trained (no chat template, no added special tokens).

Metrics, over the held-out examples:
  exact         the answer parses (json.loads) to an object with exactly the four keys, each equal
                to the reference (strings compared after strip + casefold, quantity as an integer,
                null as null).
  fields        field-level accuracy: the mean over examples and the four keys of "the key is
                present in the parsed object and equal to the reference" (an unparsable answer
                scores 0 on all four).
  valid         the answer parses to a JSON object.

The reference is transformers + PEFT in fp32 (the base is the embedded GGUF de-quantized, or an HF
dir). `--bundle` runs the tasks named by --text-task / --trained-task through prefix_edge.Runtime
instead, skipping any the bundle lacks (the plain model needs no task and is not run there).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_DIR = HERE.parent / "prefix_edge" / "models" / "smollm2-135m"
TEMPLATE = "Message: {input}\nJSON:\n"
MAX_NEW = 48
KEYS = ("name", "product", "quantity", "city")
INSTRUCTIONS = (
    "Extract the order from the customer's message as one line of JSON with exactly these keys: "
    '"name" (the customer\'s name, or null), "product" (the item in singular, lower case, or null), '
    '"quantity" (an integer, or null if no amount is given) and "city" (the delivery city, or null). '
    "Output only the JSON.")
EXAMPLES = [  # from the training set's distribution (names and cities of the training pools)
    ("Hi, this is Maria Lopez. Please send 3 blue mugs to Valencia.",
     {"name": "Maria Lopez", "product": "blue mug", "quantity": 3, "city": "Valencia"}),
    ("Can I order a desk lamp? Ship it to Osaka.",
     {"name": None, "product": "desk lamp", "quantity": 1, "city": "Osaka"}),
    ("Tom here - ten notebooks please, to my office in Brno.",
     {"name": "Tom", "product": "notebook", "quantity": 10, "city": "Brno"}),
    ("Please add some coffee filters to my order. - Aisha Khan",
     {"name": "Aisha Khan", "product": "coffee filter", "quantity": None, "city": None}),
]


def fill(text: str) -> str:
    return TEMPLATE.replace("{input}", text, 1)


def raw_prefix() -> str:
    """The text-raw prefix; the input follows as fill(input)."""
    shots = "".join(f"{fill(u)}{json.dumps(a)}\n\n" for u, a in EXAMPLES)
    return f"{INSTRUCTIONS}\n\n{shots}"


def chat_messages(text: str) -> list[dict]:
    msgs = [{"role": "system", "content": INSTRUCTIONS}]
    for u, a in EXAMPLES:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": json.dumps(a)}]
    return msgs + [{"role": "user", "content": text}]


def chat_split(tok, text: str) -> tuple[str, str]:
    """(prefix, input part) of the rendered chat prompt: the system + example turns, then the
    user turn with the generation prompt."""
    msgs = chat_messages(text)
    prefix = tok.apply_chat_template(msgs[:-1], tokenize=False)
    full = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert full.startswith(prefix), "chat template does not extend its prefix"
    return prefix, full[len(prefix):]


def score(answer: str, ref: dict) -> dict:
    line = answer.strip().split("\n")[0].strip()
    try:
        got = json.loads(line)
    except ValueError:
        got = None
    if not isinstance(got, dict):
        return {"exact": 0, "fields": 0.0, "valid": 0}

    def same(a, b):
        if isinstance(a, str) and isinstance(b, str):
            return a.strip().casefold() == b.strip().casefold()
        return a == b and type(a) is type(b)

    ok = [k in got and same(got[k], ref[k]) for k in KEYS]
    return {"exact": int(all(ok) and set(got) == set(KEYS)), "fields": sum(ok) / len(KEYS), "valid": 1}


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    return {m: round(sum(r[m] for r in rows) / n, 4) for m in ("exact", "fields", "valid")} | {"n": n}


class HF:
    """Greedy generation with transformers (fp32), optionally through a PEFT adapter."""

    def __init__(self, base: Path | None, workdir: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        sys.path.insert(0, str(HERE.parent))
        from prefix_edge.export.source import default_model_path, prepare_hf_dir

        hf_logging.set_verbosity_error()
        hf_dir = prepare_hf_dir(base or default_model_path(), workdir)
        self.tok = AutoTokenizer.from_pretrained(str(hf_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        self.eos = sorted({self.model.config.eos_token_id, self.tok.eos_token_id} - {None})
        self.torch = torch
        self._prefix_kv: dict = {}

    def generate(self, model, text: str, prefix: str = "") -> str:
        """Greedy answer to `prefix` + `text`, each tokenized on its own without added special
        tokens (as a bundle stores a task: prefix ids, then the wrapped input's ids). The prefix
        KV is computed once and copied for each call: same result, less time."""
        import copy

        torch = self.torch
        ids = self.tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        kwargs = {}
        if prefix:
            if prefix not in self._prefix_kv:
                p = self.tok(prefix, add_special_tokens=False, return_tensors="pt")["input_ids"]
                with torch.no_grad():
                    self._prefix_kv[prefix] = (p, model(p, use_cache=True).past_key_values)
            p, kv = self._prefix_kv[prefix]
            ids, kwargs = torch.cat([p, ids], dim=1), {"past_key_values": copy.deepcopy(kv)}
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                 do_sample=False, eos_token_id=self.eos, pad_token_id=self.eos[0],
                                 stop_strings=["\n"], tokenizer=self.tok, **kwargs)
        return self.tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def run_hf(args, data: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as work:
        hf = HF(args.base, Path(work))
        ways = {
            "plain": lambda x: hf.generate(hf.model, fill(x)),
            "text-raw": lambda x: hf.generate(hf.model, fill(x), raw_prefix()),
            "text-chat": lambda x: hf.generate(hf.model, *chat_split(hf.tok, x)[::-1]),
        }
        trained = None
        if (args.adapter / "adapter_config.json").is_file():
            from peft import PeftModel

            trained = PeftModel.from_pretrained(hf.model, str(args.adapter)).eval()
            ways["trained"] = lambda x: hf.generate(trained, fill(x))
        else:
            print(f"trained: no adapter at {args.adapter}, skipped", file=sys.stderr)
        results = {}
        for name, fn in ways.items():
            if args.ways and name not in args.ways.split(","):
                continue
            if trained is not None and name != "trained":
                with trained.disable_adapter():  # the base model itself, unwrapped
                    results[name] = evaluate(name, fn, data, args.verbose)
            else:
                results[name] = evaluate(name, fn, data, args.verbose)
    return results


def run_bundle(args, data: list[dict]) -> dict:
    sys.path.insert(0, str(HERE.parent))
    from prefix_edge import Runtime

    results = {}
    with Runtime.open(args.bundle, backend=args.backend, threads=args.threads) as rt:
        for label, task in (("text", args.text_task), ("trained", args.trained_task)):
            if task not in rt.tasks:
                print(f"{label}: bundle has no task {task!r}, skipped", file=sys.stderr)
                continue
            fn = lambda x, t=task: rt.generate(t, x, temperature=0.0, max_tokens=MAX_NEW, stop=["\n"]).text
            results[f"{label} ({task})"] = evaluate(task, fn, data, args.verbose)
    return results


def evaluate(name: str, fn, data: list[dict], verbose: bool) -> dict:
    t0, rows = time.perf_counter(), []
    for ex in data:
        answer = fn(ex["input"])
        rows.append(score(answer, json.loads(ex["output"])))
        if verbose:
            print(f"[{name}] {'OK ' if rows[-1]['exact'] else 'BAD'} {ex['input']!r} -> {answer!r}", file=sys.stderr)
    s = summarize(rows) | {"seconds": round(time.perf_counter() - t0, 1)}
    print(f"{name:10s} exact {s['exact']:.3f}  fields {s['fields']:.3f}  valid {s['valid']:.3f}  "
          f"(n={s['n']}, {s['seconds']} s)", file=sys.stderr)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, help="HF dir or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--adapter", type=Path, default=MODEL_DIR / "adapters" / "order_json")
    ap.add_argument("--data", type=Path, default=MODEL_DIR / "heldout.jsonl")
    ap.add_argument("--limit", type=int, help="score only the first N examples")
    ap.add_argument("--bundle", type=Path, help="score a bundle's tasks through prefix_edge.Runtime")
    ap.add_argument("--text-task", default="order_json_text")
    ap.add_argument("--trained-task", default="order_json")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ways", help="comma-separated subset of plain,text-raw,text-chat,trained (default: all)")
    ap.add_argument("--json", type=Path, help="also write the scores here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every answer")
    args = ap.parse_args()
    data = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    data = data[:args.limit] if args.limit else data
    results = run_bundle(args, data) if args.bundle else run_hf(args, data)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
