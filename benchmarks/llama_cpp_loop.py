"""Peer baseline: the plain llama-cpp-python loop a user would write (high-level `Llama`,
`generate` with greedy sampling) on the same GGUF with the same thread count.

    python benchmarks/llama_cpp_loop.py MODEL.gguf THREADS N_TOKENS CONTEXT_TOKENS [N_CTX] [--stdin]

Prints one JSON line: {"tok_s": median decode tokens/s over 3 runs, ...}. With --stdin: loads
the model, prints {"ready": true}, then runs once per line read from stdin and prints that
run's {"tok_s": ...} (so a caller can interleave its own runs with the peer's, both loaded).
"""

import json
import statistics
import sys
import time

from llama_cpp import Llama


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--stdin"]
    model, threads, n, ctx = args[0], int(args[1]), int(args[2]), int(args[3])
    n_ctx = int(args[4]) if len(args) > 4 else 2048
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                verbose=False)
    text = "The support desk answers questions about storage plans, billing and sync. " * 64
    prompt = llm.tokenize(text.encode(), add_bos=False)[:ctx]

    def run() -> float:
        llm.reset()
        t_first, count = None, 0
        for _tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            count += 1
            if t_first is None:
                t_first = time.perf_counter()
            if count == n + 1:
                break
        return n / (time.perf_counter() - t_first)

    info = {"peer": "llama-cpp-python Llama.generate", "threads": threads, "n_ctx": n_ctx}
    if "--stdin" in sys.argv:
        print(json.dumps({"ready": True, **info}), flush=True)
        for _line in sys.stdin:
            print(json.dumps({"tok_s": round(run(), 3)}), flush=True)
        return
    speeds = [run() for _ in range(3)]
    print(json.dumps({**info, "tok_s": round(statistics.median(speeds), 2)}))


if __name__ == "__main__":
    main()
