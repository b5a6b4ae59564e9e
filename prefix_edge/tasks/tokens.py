"""A rendered task's prefix as token ids, as export bakes it and a task created at run time
(runtime/tasks.py) is baked: the tokenizer's own ids (the bundle's tokenizer.json, the
`tokenizers` library's Tokenizer), a raw-text task's led by what the tokenizer adds in front of a
text (a BOS, where the model wants one)."""

from __future__ import annotations

from ..errors import PrefixEdgeError
from .taskfile import RenderedTask


def leading_special_ids(tokenizer) -> list[int]:
    """The ids a tokenizer adds in front of a text (BOS, for tokenizers that add one)."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    return []


def prefix_ids(tokenizer, rendered: RenderedTask, name: str, n_ctx: int,
               n_virtual: int = 0) -> list[int]:
    """The prefix's text ids (after `n_virtual` virtual tokens, for a peft task). A raw-text
    (chat = false) task's text starts with what the tokenizer adds in front of a text (a BOS,
    for models that want one: Gemma's answers are garbage without it), as llama.cpp and
    transformers see the same prompt; a peft one's as PEFT sees `tokenizer(text)`: soft prompt
    / prefix KV first, then BOS and the text. A chat task's template writes its own BOS."""
    text = rendered.prefix_text
    ids = tokenizer.encode(text, add_special_tokens=False).ids if text else []
    if not rendered.chat and (text or n_virtual):
        ids = leading_special_ids(tokenizer) + ids
    if not ids and not n_virtual:
        raise PrefixEdgeError(f"task '{name}': the prefix renders to no tokens")
    if n_virtual + len(ids) + 1 >= n_ctx:
        what = f"{n_virtual} virtual + {len(ids)} text" if n_virtual else f"{len(ids)}"
        raise PrefixEdgeError(f"task '{name}': prefix is {what} tokens, the model's context is {n_ctx}")
    return ids




def ids_sha256(ids) -> str:
    """The sha256 of a prefix's text ids as int64 (TaskInfo.prefix_sha256)."""
    import hashlib

    import numpy as np

    return hashlib.sha256(np.asarray(ids, np.int64).reshape(-1).tobytes()).hexdigest()
