"""How an answer is scored against its reference output. Every metric gives, per example, a
score in [0, 1], whether the answer matched exactly, and whether it was a *valid* answer of the
task's shape:

  exact        the answer (stripped) equals the reference (stripped). valid: non-empty.
  label        the answer's first word, case-folded and without punctuation, equals the reference
               label. valid: that word is one of the labels the data uses.
  json-fields  the answer's first line parses to a JSON object; the score is the fraction of the
               reference object's keys whose values match (strings compared after strip +
               casefold, numbers and null by value and type); exact = every key matches and there
               are no others. valid: it parses to an object.
  chrf         chrF (character 1..6-grams, beta = 2, whitespace ignored: Popović 2015, as
               sacrebleu's sentence chrF without word n-grams), averaged over examples; exact = the
               stripped strings are equal. valid: non-empty.

`guess_metric` picks one from the reference outputs when the caller names none.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

METRICS = ("exact", "label", "json-fields", "chrf")
_WORD = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*")


@dataclass(frozen=True)
class Score:
    score: float
    exact: bool
    valid: bool


def json_object(text: str):
    try:
        got = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return got if isinstance(got, dict) else None


def first_word(text: str) -> str:
    m = _WORD.search(text)
    return m.group(0).casefold() if m else ""


def _same(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    return a == b and type(a) is type(b)


def json_fields(answer: str, reference: str) -> Score:
    ref = json_object(reference)
    if ref is None:
        raise ValueError(f"reference output is not a JSON object: {reference!r}")
    got = json_object(answer.strip().split("\n")[0].strip())
    if got is None:
        return Score(0.0, False, False)
    ok = [k in got and _same(got[k], v) for k, v in ref.items()]
    return Score(sum(ok) / max(len(ok), 1), all(ok) and set(got) == set(ref), True)


def _ngrams(text: str, n: int) -> Counter:
    s = "".join(text.split())
    return Counter(s[i:i + n] for i in range(len(s) - n + 1))


def chrf(hyp: str, ref: str, order: int = 6, beta: float = 2.0) -> float:
    """Sentence chrF in [0, 1] as sacrebleu 2.x computes it (CHRF() defaults, /100): character
    n-gram precision and recall, each averaged over the orders 1..`order` that both strings have,
    combined as an F-beta score. (Written here: sacrebleu would bring lxml, regex, portalocker
    and tabulate into the runtime for 20 lines; tests check it against sacrebleu's values.)"""
    precisions, recalls = [], []
    for n in range(1, order + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        if h and r:
            hit = sum((h & r).values())
            precisions.append(hit / sum(h.values()))
            recalls.append(hit / sum(r.values()))
    p = sum(precisions) / len(precisions) if precisions else 0.0
    r = sum(recalls) / len(recalls) if recalls else 0.0
    if p + r == 0:
        return 0.0
    return (1 + beta ** 2) * p * r / (beta ** 2 * p + r)


def scorer(metric: str, references: list[str]):
    """A function (answer, reference) -> Score for `metric`."""
    if metric == "exact":
        return lambda a, ref: Score(float(a.strip() == ref.strip()), a.strip() == ref.strip(), bool(a.strip()))
    if metric == "label":
        labels = {first_word(r) for r in references}

        def label(a: str, ref: str) -> Score:
            word = first_word(a)
            ok = word == first_word(ref)
            return Score(float(ok), ok, word in labels)
        return label
    if metric == "json-fields":
        return json_fields
    if metric == "chrf":
        return lambda a, ref: Score(chrf(a.strip(), ref.strip()), a.strip() == ref.strip(), bool(a.strip()))
    raise ValueError(f"unknown metric {metric!r}; choose one of: {', '.join(METRICS)}")


def guess_metric(references: list[str]) -> str:
    """json-fields when every reference is a JSON object; label when every reference is one word
    and there are few distinct ones; chrf otherwise."""
    if all(json_object(r) is not None for r in references):
        return "json-fields"
    words = {r.strip() for r in references}
    if len(words) <= 20 and all(_WORD.fullmatch(w) for w in words) and len(words) < len(references):
        return "label"
    return "chrf"
