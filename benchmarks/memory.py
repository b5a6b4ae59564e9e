"""Where a runtime's memory goes: RSS after each step of opening a bundle and answering, in a
fresh process per backend (Linux /proc/self/status: VmRSS split into RssAnon and RssFile —
file-backed pages are the mmapped model, shared with the page cache and other processes).

    python benchmarks/memory.py [--bundle DIR] [--backend onnx,gguf] [--threads N] [--json FILE]

Steps: interpreter; runtime imports (prefix_edge, numpy, tokenizers); the engine's library;
the tokenizer; Runtime.open (weights, KV cache / session arena); the first request (prefix
load + compute buffers); 8 more requests. Peak is VmHWM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
def mem():
    f = {l.split(':')[0]: int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.split(':')[0] in
         ('VmRSS', 'RssAnon', 'RssFile', 'VmHWM')}
    return {'rss': f['VmRSS'], 'anon': f['RssAnon'], 'file': f['RssFile'], 'hwm': f['VmHWM']}
steps = [('interpreter', mem())]
bundle, backend, threads, task = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import numpy, tokenizers, prefix_edge
from prefix_edge import Runtime
steps.append(('runtime imports', mem()))
import importlib; importlib.import_module({'onnx': 'onnxruntime', 'gguf': 'llama_cpp'}[backend])
steps.append(('engine library', mem()))
from prefix_edge.bundle import Manifest
m = Manifest.read(bundle)
tok = tokenizers.Tokenizer.from_file(bundle + '/' + m.tokenizer.file)
steps.append(('tokenizer', mem()))
del tok
rt = Runtime.open(bundle, backend=backend, threads=threads)
steps.append(('open (weights, KV, session)', mem()))
t0 = time.perf_counter()
rt.generate(task, 'Where can I see if the service is down?', max_tokens=32)
steps.append(('first request (prefix, buffers)', mem()))
for i in range(8):
    rt.generate(task, f'Question {i}: where can I see if the service is down?', max_tokens=32)
steps.append(('8 more requests', mem()))
extra = {'kv_cells': getattr(rt.backend, 'n_ctx', None), 'bytes_per_cell': getattr(rt.backend, 'bytes_per_cell', None)}
print(json.dumps({'steps': steps, 'extra': extra}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--backend", default="onnx,gguf")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.bundle import Manifest
    from prefix_edge.paths import default_bundle
    from prefix_edge.runtime.engines.cpus import default_threads

    root = args.bundle or default_bundle()
    manifest = Manifest.read(root)
    task = max(manifest.tasks, key=lambda t: manifest.tasks[t].prefix_tokens)
    report = {}
    for backend in args.backend.split(","):
        p = subprocess.run([sys.executable, "-c", CHILD, str(root), backend,
                            str(args.threads or default_threads()), task],
                           capture_output=True, text=True, timeout=600)
        if p.returncode:
            sys.exit(f"{backend}: {p.stderr.strip().splitlines()[-1:]}")
        r = json.loads(p.stdout)
        info = manifest.backends[backend]
        model = sum((root / f).stat().st_size for f in info.files)
        prefix = manifest.tasks[task].prefixes[backend].bytes
        r.update(model_bytes=model, prefix_bytes=prefix, task=task,
                 peak_ratio=round(r["steps"][-1][1]["hwm"] / (model + prefix), 2))
        report[backend] = r
        print(f"\n{backend}: model {model / 1e6:.1f} MB + prefix ({task}) {prefix / 1e6:.1f} MB; "
              f"peak RSS {r['steps'][-1][1]['hwm'] / 1e6:.1f} MB = {r['peak_ratio']}x")
        print("| step | RSS MB | +MB | anon MB | file-backed MB |")
        print("|---|---|---|---|---|")
        prev = 0
        for name, m in r["steps"]:
            print(f"| {name} | {m['rss'] / 1e6:.1f} | {(m['rss'] - prev) / 1e6:+.1f} | "
                  f"{m['anon'] / 1e6:.1f} | {m['file'] / 1e6:.1f} |")
            prev = m["rss"]
        if r["extra"]["bytes_per_cell"]:
            e = r["extra"]
            print(f"KV cache: {e['kv_cells']} cells x {e['bytes_per_cell']} B = "
                  f"{e['kv_cells'] * e['bytes_per_cell'] / 1e6:.1f} MB")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
