"""Peer baseline: onnxruntime-genai's int4 model of the same weights (its own model builder),
greedy decode, same thread count. Runs with the interpreter of benchmarks/.venv-genai (the
builder needs transformers 5, which optimum-onnx does not support; see setup_genai.sh).

    benchmarks/.venv-genai/bin/python benchmarks/genai_generate.py HF_DIR CACHE_DIR THREADS N_TOKENS CONTEXT_TOKENS

Builds the int4 model into CACHE_DIR once, then prints one JSON line {"tok_s": median of 3}.
"""

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    hf, cache = Path(sys.argv[1]), Path(sys.argv[2])
    threads, n, ctx = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    model_dir = cache / "int4-cpu"
    if not (model_dir / "genai_config.json").exists():
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-o",
                        str(model_dir), "-p", "int4", "-e", "cpu", "-c", str(cache / "builder-cache")],
                       check=True, capture_output=True)
    cfg_path = model_dir / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    so = cfg["model"]["decoder"].setdefault("session_options", {})
    so["intra_op_num_threads"], so["inter_op_num_threads"] = threads, 1
    cfg_path.write_text(json.dumps(cfg, indent=2))

    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    ids = [(100 + i) % 40000 for i in range(ctx)]

    def gen(k: int) -> float:
        params = og.GeneratorParams(model)
        params.set_search_options(min_length=ctx + k, max_length=ctx + k, do_sample=False)  # no early EOS
        g = og.Generator(model, params)
        t0 = time.perf_counter()
        g.append_tokens(ids)
        for _ in range(k):
            g.generate_next_token()
        return time.perf_counter() - t0

    gen(2)
    speeds = [(n - 1) / (gen(n) - gen(1)) for _ in range(3)]
    print(json.dumps({"peer": f"onnxruntime-genai {og.__version__} int4", "tok_s": round(statistics.median(speeds), 2),
                      "threads": threads, "model_mb": round(sum(f.stat().st_size for f in model_dir.iterdir()) / 1e6, 1)}))


if __name__ == "__main__":
    main()
