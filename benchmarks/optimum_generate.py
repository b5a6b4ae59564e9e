"""Peer baseline: optimum's ORTModelForCausalLM.generate on the bundle's own ONNX graph, same
thread count, greedy. Runs in its own process (it imports torch; the runtime never does).

    python benchmarks/optimum_generate.py BUNDLE THREADS N_TOKENS CONTEXT_TOKENS

Prints one JSON line: {"tok_s": median decode tokens/s over 3 runs, ...}. Decode speed is
(N-1) / (time to generate N tokens - time to generate 1 token), so the prefill cancels out.
"""

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    bundle, threads, n, ctx = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import LlamaConfig

    m = json.loads((bundle / "manifest.json").read_text())
    mi = m["model"]
    tmp = Path(tempfile.mkdtemp(prefix="optimum-peer-"))
    onnx_files = [f for f in m["backends"]["onnx"]["files"]]
    for f in onnx_files:
        os.symlink((bundle / f).resolve(), tmp / Path(f).name)
    LlamaConfig(vocab_size=mi["vocab_size"], hidden_size=mi["hidden_size"], num_hidden_layers=mi["n_layers"],
                num_attention_heads=mi["n_heads"], num_key_value_heads=mi["n_kv_heads"],
                head_dim=mi["head_dim"], max_position_embeddings=mi["n_ctx"],
                rope_theta=mi["rope"]["theta"], eos_token_id=mi["eos_token_ids"][0],
                use_cache=True).save_pretrained(tmp)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    torch.set_num_threads(threads)
    model = ORTModelForCausalLM.from_pretrained(tmp, session_options=opts, provider="CPUExecutionProvider",
                                                use_cache=True)
    ids = torch.arange(100, 100 + ctx, dtype=torch.long).remainder(mi["vocab_size"])[None]
    mask = torch.ones_like(ids)

    def gen(k: int) -> float:
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=k, min_new_tokens=k,
                       do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    gen(2)
    speeds = [(n - 1) / (gen(n) - gen(1)) for _ in range(3)]
    print(json.dumps({"peer": "optimum ORTModelForCausalLM.generate", "tok_s": round(statistics.median(speeds), 2),
                      "threads": threads}))


if __name__ == "__main__":
    main()
