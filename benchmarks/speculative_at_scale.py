"""speculative="lookup" at 1B: a random-weight checkpoint with Llama-3.2-1B's published config
(benchmarks/models_at_scale.py builds it), exported with the demo tasks (the prompt tasks as they
are; order_json's schema and template as a text task, its trained adapter being SmolLM2's own),
then what a verified row costs (benchmarks/verify_cost.py) and `prefix-edge bench --speculative`
on the demo tasks' held-out inputs.

Random weights decide the speed of a forward as real ones do, but not what the model writes: its
next-token distributions are nearly flat, so lookups are rarely accepted (the forced tokens of a
JSON schema always are) and nearly every step is a near tie, where verified rows and one-token
steps round differently. Read the tokens-per-forward and decode rows of this run, not its
"answers equal".

    python benchmarks/speculative_at_scale.py [--work /tmp/prefix-edge-spec-1b] [--inputs 10]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# order_json's trained adapter is SmolLM2's own: at another model it becomes a text task with
# the same template, schema and limits, and a raw-text prefix saying what to write
AS_TEXT = 'kind = "text"\nprefix = "Each order message, then its details as one line of JSON: name, product, ' \
          'quantity, city.\\n\\n"'


def tasks_file(demo: str) -> str:
    """The demo tasks file with order_json as a text task and without the trained twins."""
    head, rest = demo.split("[task.order_json]", 1)
    order = "[task.order_json]" + rest.split("\n# ---", 1)[0]  # up to the trained twins' block
    order = re.sub(r'kind = "peft"\nadapter = "[^"]*"', lambda _: AS_TEXT, order)
    return head + order.rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/prefix-edge-spec-1b")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--inputs", type=int, default=10, help="held-out inputs per task")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="bench's JSON report (default: WORK/speculative.json)")
    a = ap.parse_args()
    import models_at_scale

    from prefix_edge.paths import default_bundle, default_tasks_file

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    tasks = work / "tasks.toml"
    tasks.write_text(tasks_file(default_tasks_file().read_text(encoding="utf-8")), encoding="utf-8")
    hf = models_at_scale.build(a.model, work / "hf", default_bundle() / "tokenizer")
    bundle = work / "bundle"
    if not (bundle / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "prefix_edge", "export", str(hf), "--tasks", str(tasks),
                        "--out", str(bundle), "--quantize", "int4", "--gguf-quant", "q4_1",
                        "--format", "onnx,gguf", "--force"], check=True)
    subprocess.run([sys.executable, str(HERE / "verify_cost.py"), "--bundle", str(bundle), "--threads",
                    str(a.threads), "--reps", "12", "--json", str(work / "verify_cost.json")], check=True)
    subprocess.run([sys.executable, "-m", "prefix_edge", "bench", "--bundle", str(bundle), "--speculative",
                    "--runs", str(a.inputs), "--no-peers", "--threads", str(a.threads),
                    "--out", a.out or str(work / "speculative.json")], check=True)


if __name__ == "__main__":
    main()
