"""Incremental detokenization with stop strings.

Text is released only when it is complete: never half a multi-byte character, and never a
tail that might be the start of a stop string. A stop string split across tokens still stops,
and is not part of the output.
"""

from __future__ import annotations

from tokenizers import Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stops: list[str]):
        self.tok = tokenizer
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pending = ""  # decoded, not yet released
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        """Add one generated token; return the text that can be released now."""
        self.ids.append(token)
        self._advance(final=False)
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: release whatever is left (unless a stop string cut it)."""
        if self.stopped:
            return ""
        self._advance(final=True)
        return self._release(final=True)

    def _advance(self, final: bool) -> None:
        before = self._decode(self.ids[self._prefix_offset:self._read_offset])
        now = self._decode(self.ids[self._prefix_offset:])
        if len(now) > len(before) and (final or not now.endswith("\ufffd")):
            self._pending += now[len(before):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.ids)

    def _release(self, final: bool) -> str:
        text = self._pending
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)]
        hold = 0
        if not final:
            for s in self.stops:
                for n in range(min(len(s) - 1, len(text)), hold, -1):
                    if text.endswith(s[:n]):
                        hold = n
                        break
        out, self._pending = text[: len(text) - hold], text[len(text) - hold:]
        return out


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet back to bytes (tokenizers' ByteLevel pre-tokenizer)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTES = _byte_decoder()


class TokenBytes:
    """The bytes each token stands for, for logprobs and constrained decoding (a token may be
    part of a character). Byte-level BPE vocabularies (a ByteLevel pre-tokenizer: GPT-2, Llama 3,
    Qwen, SmolLM) spell bytes in GPT-2's alphabet; others (SentencePiece style) spell text with
    `▁` for a space and `<0xNN>` byte tokens. Added tokens are their own text."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        pre = tok.pre_tokenizer  # its own JSON, not the whole tokenizer's (tens of ms)
        self.byte_level = pre is not None and b'"ByteLevel"' in pre.__getstate__()
        self.added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
        self.special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}

    def __call__(self, token_id: int) -> bytes:
        token_id = int(token_id)
        if token_id in self.added:
            return self.added[token_id].encode("utf-8")
        piece = self.tok.id_to_token(token_id) or ""
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        if self.byte_level and all(ch in _BYTES for ch in piece):
            return bytes(_BYTES[ch] for ch in piece)
        return piece.replace("\u2581", " ").encode("utf-8")

    def table(self, n_vocab: int) -> list[bytes]:
        return [self(i) for i in range(n_vocab)]


COUNT_CHUNK = 1 << 16  # characters of a long input tokenized at a time while counting


def longer_than(tokenizer: Tokenizer, text: str, limit: int) -> bool:
    """Whether a long `text` is surely more than `limit` tokens, counted a chunk at a time and
    no further than the limit: an input far beyond the context is refused without tokenizing all
    of it at once (a tokenizer keeps ~100 bytes per token). A chunk's edge can split a token or
    a special token's text, so each chunk counts 16 tokens fewer. A text of at most one chunk
    is not counted here (False): it is tokenized anyway, and then counted exactly."""
    if len(text) <= COUNT_CHUNK:
        return False
    n = 0
    for i in range(0, len(text), COUNT_CHUNK):
        n += max(len(tokenizer.encode(text[i:i + COUNT_CHUNK], add_special_tokens=False).ids) - 16, 0)
        if n > limit:
            return True
    return False
