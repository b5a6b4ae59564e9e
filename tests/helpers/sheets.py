"""Documents and questions the prompt-cache tests send (tests/test_prompt_cache.py,
tests/test_cache_budget.py): three short product sheets, each ~40 tokens, and three questions."""

from __future__ import annotations

DOCS = [
    "Document A. The Orion desk lamp ships from Porto in three days; its warranty is two years "
    "and the shade is aluminium. Returns are free within thirty days of delivery.",
    "Document B. The Vega kettle holds 1.7 litres, boils in four minutes and switches off by "
    "itself. It is sold in red, black and white, and it costs forty euros.",
    "Document C. The Lyra chair folds flat, carries 120 kg and weighs five kilos. Its frame is "
    "oak; the seat is woven cord. Assembly takes ten minutes with the key in the box.",
]
QUESTIONS = ["How long is the warranty?", "What colours are there?", "How much does it weigh?"]


def ask_text(doc: str, q: str) -> str:
    return f"{doc}\n\nQuestion: {q}"
