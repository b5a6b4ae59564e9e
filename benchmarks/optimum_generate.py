"""Peer baseline: optimum's ORTModelForCausalLM.generate on optimum's graph of the bundle's
weights, same thread count, greedy. A bundle built by optimum (`--onnx-builder optimum`) is run
as it is; for prefix-edge's own fused graph, optimum's graph is made from the bundle's GGUF (the
weights the export started from when its source is a GGUF) with the same quantization, once
(cached under $PREFIX_EDGE_HOME/bench-cache/optimum). Runs in its own process (it imports torch; the runtime never does).

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


def optimum_graph(bundle: Path, m: dict) -> list[Path]:
    """optimum's graph of the bundle's GGUF weights, quantized as the bundle's ONNX model."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.export.onnx import export_onnx
    from prefix_edge.export.source import prepare_hf_dir
    from prefix_edge.paths import home
    from prefix_edge.quantize.onnx import quantize_onnx

    info = m["backends"]["onnx"]
    cache = home() / "bench-cache" / "optimum" / info["fingerprint"][:16]
    out = cache / "model.onnx"
    if not out.exists():
        gguf = [f for f in m["backends"].get("gguf", {}).get("files", {}) if f.endswith(".gguf")]
        if not gguf:
            sys.exit("the bundle has no GGUF model to rebuild optimum's graph from")
        work = cache / "work"
        hf = prepare_hf_dir(bundle / gguf[0], work)
        quantize_onnx(export_onnx(hf, work / "onnx"), cache / "partial.onnx", info["quantization"])
        (cache / "partial.onnx").replace(out)
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return [out]


def main() -> None:
    bundle, threads, n, ctx = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from prefix_edge.export.onnx import optimum_unavailable

    if (why := optimum_unavailable()) is not None:  # (its own environment: prefix-edge[optimum])
        sys.exit(f"optimum's baseline: {why}")
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import LlamaConfig

    m = json.loads((bundle / "manifest.json").read_text())
    mi = m["model"]
    tmp = Path(tempfile.mkdtemp(prefix="optimum-peer-"))
    onnx_files = [bundle / f for f in m["backends"]["onnx"]["files"]]
    if m.get("extra", {}).get("onnx_builder", "optimum") != "optimum":
        onnx_files = optimum_graph(bundle, m)
    for f in onnx_files:
        os.symlink(Path(f).resolve(), tmp / Path(f).name)
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
