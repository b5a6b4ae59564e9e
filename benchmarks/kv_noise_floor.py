"""The agreement floor of a KV store: what a ±1-ulp change of the stored prefix KV does.

For each demo task with a held-out set (the first --limit lines), every stored KV value of the
task's exact prefix is moved by one unit in the last place (random sign, seeded): fp32 for
ONNX, f16 cells for llama.cpp. Each input is answered greedily from the exact prefix, and that
answer is fed to the perturbed one (teacher forcing, kv_compare.py). A reduced store (f16/q8_0
prefix files, llama.cpp's q8_0 cache) cannot agree more often than this: it changes every
value by far more than an ulp.

    python benchmarks/kv_noise_floor.py --backend onnx|gguf [--limit 15] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from kv_compare import add_common_args, greedy, held_out, teacher_forced


def perturbed(be, prefix, rng):
    from prefix_edge.runtime.engines.prefix import Prefix

    if be.name == "onnx":  # fp32: x * (1 ± 2^-23) is x moved by about one ulp
        from prefix_edge.runtime.engines.onnx.state import KvArrays

        kv = [(a * (1 + np.float32(2.0 ** -23) * rng.choice(np.float32([-1, 1]), size=a.shape))).astype(a.dtype)
              for a in prefix.state.kv]
        state = KvArrays(kv, prefix.state.states)
    else:  # llama.cpp f16 cells: ±1 on the bit pattern of every normal, nonzero value
        from prefix_edge.llamacpp.seqstate import parse_seq_state
        from prefix_edge.runtime.engines.llama.state import SeqBlob

        kv = np.array(prefix.state.blob)
        info = parse_seq_state(kv)
        if info.k_type != 1:
            sys.exit("the GGUF bundle's cache is not f16")
        for lay in info.layers:
            for off, n in ((lay.k_offset, info.cell_count * lay.k_row_bytes),
                           (lay.v_offset, info.cell_count * lay.v_row_bytes)):
                u = kv[off:off + n].view("<u2")
                ok = (u & 0x7FFF) > 0x0400
                u[ok] = (u[ok].astype(np.int32) + rng.choice([-1, 1], size=int(ok.sum()))).astype(np.uint16)
        state = SeqBlob(kv)
    return Prefix(prefix.ids, state, prefix.metadata, n_virtual=prefix.n_virtual)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", type=Path)
    ap.add_argument("--backend", choices=["onnx", "gguf"], required=True)
    add_common_args(ap, limit=15)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

    from prefix_edge import Runtime

    rng = np.random.default_rng(0)
    tokens = agree = answers = same = 0
    with Runtime.open(args.bundle, backend=args.backend, threads=args.threads) as rt:
        for task in rt.tasks:
            held = held_out(rt, task, args.limit, args.max_tokens)
            if held is None:
                continue
            rows, n_max, _, _ = held
            exact, _ = rt.prefixes.get(task)
            noisy = perturbed(rt.backend, exact, rng)
            for ex in rows:
                ids = rt.encode_input(task, ex.input)
                ref, _ = greedy(rt.backend, exact, ids, n_max, rt.eos)
                a = teacher_forced(rt.backend, noisy, ids, ref)
                tokens, agree, answers, same = tokens + len(ref), agree + a, answers + 1, same + (a == len(ref))
    out = {"backend": args.backend, "answers": answers, "identical_answers": same / max(1, answers),
           "tokens": tokens, "teacher_forced_agreement": agree / max(1, tokens)}
    print(f"{args.backend}, every prefix KV value ±1 ulp: teacher-forced token agreement "
          f"{out['teacher_forced_agreement']:.4f} ({agree}/{tokens}), identical answers {same}/{answers}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
