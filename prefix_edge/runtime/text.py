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
