"""Documents given with a call (`documents=`, compose_documents off): three seeded product sheets
(~690 input tokens with the question), three questions in a row on the default bundle's base
model, each with the prompt cache on and then off (`use_prompt_cache=False`, the reference):
time to first token, cached tokens, and whether the tokens are equal. Both engines.

    python benchmarks/documents_cache.py            # PREFIX_EDGE_HOME: where the default bundle is
"""

from __future__ import annotations

import random

from prefix_edge import Runtime


def documents(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"title": f"{n} sheet", "text": " ".join(
        f"The {n} model {i} costs {rng.randint(10, 99)} euros and ships in {rng.randint(1, 9)} days."
        for i in range(12))} for n in ("Orion", "Vega", "Lyra")]


QUESTIONS = ["What does the Orion model 3 cost?", "How fast does the Vega model 5 ship?",
             "What does the Lyra model 7 cost?"]


def main() -> None:
    docs = documents()
    print("| engine | request | TTFT ms, cache on | cached tokens | input tokens | TTFT ms, cache off | tokens equal |")
    print("|---|---|---|---|---|---|---|")
    for backend in ("onnx", "gguf"):
        with Runtime.open(backend=backend) as rt:
            for i, q in enumerate(QUESTIONS):
                m = [{"role": "user", "content": q}]
                on = rt.generate(None, messages=m, documents=docs, max_tokens=8)
                off = rt.generate(None, messages=m, documents=docs, max_tokens=8, use_prompt_cache=False)
                what = "first" if i == 0 else "same documents, new question"
                print(f"| {backend} | {what} | {on.stats.ttft_ms:,.0f} | {on.stats.cached_tokens} | "
                      f"{on.stats.input_tokens} | {off.stats.ttft_ms:,.0f} | {on.tokens == off.tokens} |")


if __name__ == "__main__":
    main()
