"""User text in a chat rendering: found again after the template has rendered it, so that only
the template's own markup spells control tokens.

Before a conversation is rendered, every string a request brings (message text, tool results,
tool-call arguments and ids, names, tool definitions) that spells a special token, or could
join a neighbour into one (it ends with the start of one or starts with the end of one), is
*marked*: bracketed by two private-use characters, each special token's text in it replaced
by a private-use character of its own. The template then renders markup and marked text, and
no special token's text comes from the user. `Marks.unmark` gives the rendering back with the
user's text restored, and the spans of it that were marked: those are tokenized as plain text
(special tokens split), everything else as the template wrote it. Strings that touch no special
token are left as they are, and tokenized with the markup exactly as before.
"""

from __future__ import annotations

import bisect
import copy
import re
from dataclasses import replace

from ...errors import PrefixEdgeError

PLANES = (0xF0000, 0x100000)  # supplementary private-use planes: 65534 characters each
PRIVATE = re.compile("[\U000F0000-\U0010FFFF]")


class Marks:
    def __init__(self, special_texts: list[str]):
        self.texts = sorted({t for t in special_texts if t}, key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, self.texts))) if self.texts else None
        self.starts = {t[:k] for t in self.texts for k in range(1, len(t))}  # proper prefixes
        self.ends = {t[k:] for t in self.texts for k in range(1, len(t))}    # proper suffixes
        self.longest = max(map(len, self.texts), default=0)

    def touches(self, s: str) -> bool:
        """Whether s spells a special token or could join a neighbour into one."""
        if self.pattern is None or not s:
            return False
        if self.pattern.search(s):
            return True
        n = min(len(s), self.longest - 1)
        return any(s[-k:] in self.starts or s[:k] in self.ends for k in range(1, n + 1))

    # -- marking -------------------------------------------------------------------------
    def needed(self, messages: list[dict], tools) -> bool:
        return any(self.touches(s) for s in strings([messages, tools.tools if tools else None]))

    def choose(self, seen) -> "Marks":
        """These marks with private-use characters that none of the `seen` strings uses (the
        user's own are kept as they are)."""
        used = sorted({ord(c) for s in seen for c in PRIVATE.findall(s)})
        n = len(self.texts) + 2
        for plane in PLANES:
            base = plane
            while base + n <= plane + 65534:
                i = bisect.bisect_left(used, base)
                if i < len(used) and used[i] < base + n:  # the user's: look after it
                    base = used[i] + 1
                    continue
                m = copy.copy(self)
                m.open, m.close = chr(base), chr(base + 1)
                m.code = {t: chr(base + 2 + i) for i, t in enumerate(self.texts)}
                m.own = re.compile(f"[{chr(base)}-{chr(base + n - 1)}]")
                return m
        raise PrefixEdgeError("the messages spell special tokens and use every private-use "
                              "character this runtime marks user text with: cannot keep them apart")

    def mark(self, s: str) -> str:
        if not self.touches(s):
            return s
        return self.open + self.pattern.sub(lambda m: self.code[m.group()], s) + self.close

    def mark_all(self, obj):
        """obj (JSON-like) with every string marked, keys included; any depth."""
        return _map_strings(obj, self.mark)

    def mark_message(self, m: dict) -> dict:
        """A checked message with its strings marked (its role kept)."""
        return {k: (v if k == "role" else self.mark_all(v)) for k, v in m.items()}

    def mark_tools(self, spec):
        return None if spec is None else replace(spec, tools=self.mark_all(spec.tools))

    # -- the rendering back --------------------------------------------------------------
    def unmark(self, text: str):
        """(the text with the user's text restored, the spans of marked text in it, a function
        that moves a position in `text` to the restored text). A bracket the template dropped
        (it cut a marked string) is ignored; a special token's text outside brackets is a span
        of its own."""
        events = [(m.start(), m.group()) for m in self.own.finditer(text)]
        opens, pairs = [], set()
        for pos, ch in events:
            if ch == self.open:
                opens.append(pos)
            elif ch == self.close and opens:
                pairs.update((opens.pop(), pos))
        names = {c: t for t, c in self.code.items()}
        out, spans, at, n, depth, start = [], [], 0, 0, 0, 0
        where, shift = [], []
        for pos, ch in events:
            out.append(text[at:pos])
            n += pos - at
            at = pos + 1
            if ch in (self.open, self.close):
                if pos in pairs:
                    if ch == self.open:
                        start = n if depth == 0 else start
                        depth += 1
                    else:
                        depth -= 1
                        if depth == 0 and n > start:
                            spans.append((start, n))
            else:
                t = names[ch]
                if depth == 0:
                    spans.append((n, n + len(t)))
                out.append(t)
                n += len(t)
            where.append(pos)
            shift.append(n - at)
        out.append(text[at:])

        def moved(c: int) -> int:
            i = bisect.bisect_left(where, c)
            return c + (shift[i - 1] if i else 0)
        return "".join(out), spans, moved


def parsed_args(m: dict) -> dict:
    """A message with its tool calls' JSON-string arguments parsed, as the fallback prompt reads
    them (tools.for_template): then the strings inside them are what is rendered."""
    if not m.get("tool_calls"):
        return m
    calls = [{**c, "function": {**c["function"], "arguments": _parsed(c["function"]["arguments"])}}
             for c in m["tool_calls"]]
    return {**m, "tool_calls": calls}


def _parsed(args):
    import json

    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except (ValueError, RecursionError):
        return args


def strings(obj):
    """Every string in obj (JSON-like), keys included; any depth."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _map_strings(obj, f):
    """obj (JSON-like) with f applied to every string, keys included; iterative (any depth)."""
    if isinstance(obj, str):
        return f(obj)
    if not isinstance(obj, (dict, list, tuple)):
        return obj
    root: list = [None]
    stack = [(obj, root, 0)]
    while stack:
        src, into, key = stack.pop()
        items = src.items() if isinstance(src, dict) else enumerate(src)
        new: dict | list = {} if isinstance(src, dict) else [None] * len(src)
        into[key] = new
        for k, v in items:
            k = f(k) if isinstance(k, str) else k
            if isinstance(v, (dict, list, tuple)):
                new[k] = None
                stack.append((v, new, k))
            else:
                new[k] = f(v) if isinstance(v, str) else v
    return root[0]
