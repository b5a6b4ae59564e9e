"""Peer baseline: the plain llama-cpp-python loop a user would write (high-level `Llama`,
`generate` with greedy sampling) on the same GGUF with the same thread count.

    python benchmarks/llama_cpp_loop.py MODEL.gguf THREADS N_TOKENS CONTEXT_TOKENS [N_CTX]

Prints one JSON line: {"tok_s": median decode tokens/s over 3 runs, ...}.
"""

import json
import statistics
import sys
import time

from llama_cpp import Llama


def main() -> None:
    model, threads, n, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    n_ctx = int(sys.argv[5]) if len(sys.argv) > 5 else 2048
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                verbose=False)
    text = "The support desk answers questions about storage plans, billing and sync. " * 64
    prompt = llm.tokenize(text.encode(), add_bos=False)[:ctx]
    speeds = []
    for _ in range(3):
        llm.reset()
        t_first, count = None, 0
        for _tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            count += 1
            if t_first is None:
                t_first = time.perf_counter()
            if count == n + 1:
                break
        speeds.append(n / (time.perf_counter() - t_first))
    print(json.dumps({"peer": "llama-cpp-python Llama.generate", "tok_s": round(statistics.median(speeds), 2),
                      "threads": threads, "n_ctx": n_ctx}))


if __name__ == "__main__":
    main()
