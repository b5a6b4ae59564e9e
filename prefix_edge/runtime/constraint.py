"""Constrained decoding: a JSON schema, a regex or a Lark grammar becomes a token mask per step
(llguidance, MIT; no torch), applied in the one sampler above the engines, so batching,
streaming, stop strings, penalties, n choices and cancellation work as without it. Greedy with
a constraint picks the greedy token whenever the constraint allows it.

JSON is written in one style: `{"key": value, "key": value}` (": " and ", ", no other
whitespace), the style of OpenAI's and the demo tasks' JSON; a small model left free to add
whitespace can loop on newlines. The vocabulary llguidance sees is the runtime's own token
bytes (text.TokenBytes), special tokens marked as such: grammar text never matches them, and the
model's end-of-sequence token ends the output once the constraint accepts it.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any, Callable

import numpy as np

from ..errors import PrefixEdgeError

JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
KINDS = ("json_schema", "regex", "grammar")


def spec_of(opts: dict) -> tuple[str, str] | None:
    """(kind, text) of the constraint the options ask for, or None."""
    for kind in KINDS:
        v = opts.get(kind)
        if v is None or v is False:
            continue
        if kind == "json_schema":
            v = {"type": "object"} if v is True else v
            return kind, json.dumps(v, ensure_ascii=False)  # key order: the schema's property order
        return kind, v
    return None


class _Vocab:
    """What llguidance's TokenizerWrapper reads: token bytes, specials, and an encoder."""

    def __init__(self, tokenizer, token_bytes, n_vocab: int, eos: list[int]):
        self.eos_token_id = eos[0]
        self.bos_token_id = None
        table = token_bytes.table(n_vocab)
        # ids past the tokenizer's vocabulary (padded embeddings) and specials never match text
        self.special_token_ids = sorted(set(token_bytes.special) | {i for i, b in enumerate(table) if not b})
        self.tokens = [b if b else f"<[{i}]>".encode() for i, b in enumerate(table)]
        self._tok = tokenizer

    def __call__(self, s):
        if isinstance(s, bytes):
            raise TypeError("text only")
        return self._tok.encode(s, add_special_tokens=False).ids


class Grammars:
    """A runtime's constraint compiler: the llguidance tokenizer (built on first use, ~0.5 s for
    a 49k vocabulary) and compiled grammars (checked once per distinct spec)."""

    def __init__(self, tokenizer, token_bytes: Callable[[], Any], n_vocab: int, eos: list[int]):
        # token_bytes: made on first use too (text.TokenBytes serialises the tokenizer: ~70 ms)
        self._args = (tokenizer, token_bytes, n_vocab, sorted(eos))
        self.n_vocab = n_vocab
        self._lock = threading.Lock()
        self._ll = None

    def _tokenizer(self):
        with self._lock:
            if self._ll is None:
                try:
                    import llguidance
                except ImportError:
                    raise PrefixEdgeError("constrained decoding needs llguidance: pip install llguidance") from None
                tok, tb, n, eos = self._args
                self._ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tok, tb(), n, eos)),
                                                  n_vocab=n, eos_token=eos)
            return self._ll

    @functools.lru_cache(maxsize=64)
    def grammar(self, kind: str, text: str) -> str:
        """The checked llguidance grammar of a spec (one line naming the problem otherwise)."""
        import llguidance

        ll = self._tokenizer()
        try:
            if kind == "json_schema":
                g = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_STYLE)
            elif kind == "regex":
                g = llguidance.LLMatcher.grammar_from_regex(text)
            else:
                g = llguidance.LLMatcher.grammar_from_lark(text)
        except (ValueError, TypeError) as e:
            raise PrefixEdgeError(f"{kind}: {str(e).splitlines()[0] if str(e) else 'not valid'}") from None
        bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(g, ll)
        if bad:
            raise PrefixEdgeError(f"{kind}: {messages[0].splitlines()[0] if messages else 'not supported'}")
        return g

    def constraint(self, opts: dict) -> "Constraint | None":
        spec = spec_of(opts)
        if spec is None:
            return None
        import llguidance

        g = self.grammar(*spec)
        return Constraint(llguidance.LLMatcher(self._tokenizer(), g, log_level=0), self.n_vocab)


class Constraint:
    """One request's matcher: mask(logits) before each choice, consume(token) after it."""

    def __init__(self, matcher, n_vocab: int):
        import llguidance.numpy as lnp

        self._m, self._n, self._lnp = matcher, n_vocab, lnp
        self._bits = lnp.allocate_token_bitmask(1, n_vocab)

    def allowed(self) -> np.ndarray:
        self._lnp.fill_next_token_bitmask(self._m, self._bits, 0)
        if self._m.is_error():
            raise PrefixEdgeError(f"constraint: {self._m.get_error()}")
        return np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")[:self._n].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        ok = self.allowed()
        n = min(len(ok), logits.shape[0])
        out = np.full(logits.shape, -np.inf, np.float32)
        out[:n] = np.where(ok[:n], logits[:n], -np.inf)
        return out

    def consume(self, token: int) -> None:
        self._m.consume_token(int(token))

    def copy(self) -> "Constraint":
        c = Constraint.__new__(Constraint)
        c._m, c._n, c._lnp = self._m.deep_copy(), self._n, self._lnp
        c._bits = self._lnp.allocate_token_bitmask(1, self._n)
        return c
