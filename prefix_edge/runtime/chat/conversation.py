"""Conversation: a chat with one task (or the base model) that keeps its history.

    conv = rt.chat("support")            # or rt.chat() for the base model, rt.chat(system=...)
    conv.send("my sync stopped").text    # a Result; the history now has both turns
    for chunk in conv.stream("and on Plus?"): ...
    conv.save("chat.pe")                 # messages + the KV of the conversation so far
    conv = rt.resume("chat.pe")          # in another process: the next turn prefills only itself

Each turn is one request with messages = history + the new user message: the runtime renders
it with the model's chat template and the turn cache resumes it after the previous turn's
prompt (cache/prompts.py). A reply joins the history when its stream ends, with what it produced
(also when cancelled or cut by max_tokens); a failed turn adds nothing. One turn at a time.

A saved conversation is a prefix file (the bundle's codec, bundle/prefixfile.py): the KV of
its last prompt, the prompt's ids, and metadata with the messages, the task, the bundle's
fingerprint and the task's digest. Loading checks them like a baked prefix; a file from another
bundle or model keeps its messages and re-reads them on the next turn.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ...errors import PrefixEdgeError, disk_full
from ..cache.prompts import cache_root
from .render import check_messages

if TYPE_CHECKING:
    from ...bundle import Manifest
    from ..stream import Result, Stream
    from ..cache.prompts import PromptCache


class Runtime(Protocol):
    """What a Conversation uses of its runtime (runtime.py's Runtime; named here so that this
    module does not import that one, which creates conversations)."""

    manifest: "Manifest"
    fingerprint: str
    prefill_chunk: int
    prompts: "PromptCache"
    backend: Any

    def options(self, task: str | None, overrides: dict) -> dict: ...

    def stream(self, task: str | None, text: str | None = None, **kw) -> "Stream": ...

    def chat_input(self, task: str | None, messages: list) -> tuple: ...

FORMAT = "prefix-edge-conversation/1"


class Conversation:
    def __init__(self, rt: "Runtime", task: str | None = None, system: str | None = None,
                 messages: list | None = None, **defaults):
        if task is not None and task not in rt.manifest.tasks:
            raise PrefixEdgeError(f"unknown task {task!r}; this bundle has: "
                                  f"{', '.join(sorted(rt.manifest.tasks))}")
        rt.options(task, defaults)  # bad defaults fail here, not at the first turn
        self.rt, self.task, self.defaults = rt, task, defaults
        self.messages: list[dict[str, str]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        if messages:
            self.messages += check_messages(list(messages) + [{"role": "user", "content": "x"}])[:-1]
        self._busy = False
        self._last = None  # (root, ids, cuts) of the last turn's prompt: its KV in the turn cache

    def stream(self, text: str, **overrides) -> "Stream":
        """Start the next turn; the reply joins the history when the stream ends."""
        if self._busy:
            raise PrefixEdgeError("this conversation's previous reply is still streaming: read or "
                                  "cancel it first")
        msgs = self.messages + [{"role": "user", "content": text}]
        s = self.rt.stream(self.task, messages=msgs, **{**self.defaults, **overrides})
        self._busy = True
        self._last = s._req.call.turn  # the key its KV is kept under (rendered once, by the request)

        def ended(result) -> None:
            self._busy = False
            if result is not None:
                self.messages = msgs + [{"role": "assistant", "content": result.text}]
        s.on_end = ended
        return s

    def send(self, text: str, timeout: float | None = None, **overrides) -> "Result":
        """The next turn, to its end."""
        return self.stream(text, **overrides).wait(timeout)

    def reset(self) -> None:
        """A new chat: the history goes (a system message given at the start stays)."""
        if self._busy:
            raise PrefixEdgeError("a reply is still streaming")
        self.messages = [m for m in self.messages[:1] if m["role"] == "system"]
        self._last = None

    # -- files --------------------------------------------------------------------------
    def _prompt_key(self, msgs: list) -> tuple:
        ids, cuts, _ = self.rt.chat_input(self.task, msgs)
        info = self.rt.manifest.tasks[self.task] if self.task is not None else None
        return (cache_root(self.task, "", info), ids, cuts)

    def _reply_key(self, msgs: list) -> tuple | None:
        """The prompt-cache key of `msgs` read up to the end of their last reply, as the
        read-ahead keeps it (read_ahead.py: the next turn's cut there), or None."""
        from .read_ahead import PLACEHOLDER

        if not msgs or msgs[-1]["role"] != "assistant":
            return None
        try:
            root, ids, cuts = self._prompt_key(msgs + [PLACEHOLDER])
        except PrefixEdgeError:
            return None
        return (root, ids[:cuts[-1]], tuple(cuts[:-1])) if cuts else None

    def _meta(self) -> dict[str, str]:
        rt = self.rt
        digest = rt.manifest.task_digest(self.task) if self.task is not None else ""
        return {"format": FORMAT, "fingerprint": rt.fingerprint, "task": self.task or "",
                "task_digest": digest, "prefill_chunk": str(rt.prefill_chunk),
                "messages": json.dumps(self.messages, ensure_ascii=False)}

    def save(self, path: str | Path, signed: bool = False) -> bool:
        """Write the conversation; True if its KV went with it (it is in the prompt cache).
        signed: with a MAC under this home's secret (paths.secret_key), so that `load(...,
        signed=True)` reads it back only as this user's process wrote it: for files kept where
        others could write (a shared folder). A signed file loads only in the same home."""
        if self._busy:
            raise PrefixEdgeError("a reply is still streaming: save after it ends")
        path = _path(path)
        if path.is_dir() or not path.name:
            raise PrefixEdgeError(f"{path}: a directory; save a conversation to a file")
        if not path.parent.is_dir():
            raise PrefixEdgeError(f"{path}: its directory {path.parent} does not exist")
        meta = self._meta()
        key = _key() if signed else None
        entry = None
        if self._last is not None:
            root, ids, cuts = self._last
            entry = self.rt.prompts.get(root, ids, cuts)
            ahead = self._reply_key(self.messages) if entry is None else None
            if ahead is not None and self.rt.prompts.get(*ahead) is not None:
                # the last prompt's state was replaced by its reply read ahead (a longer one)
                root, ids, cuts = ahead
                entry = self.rt.prompts.get(root, ids, cuts)
            meta["turn_ids"] = json.dumps([int(x) for x in ids])
            meta["turn_cuts"] = json.dumps(list(cuts))
        tmp = path.with_name(path.name + ".tmp")
        try:
            if entry is not None:
                self.rt.backend.write_snapshot(tmp, entry.prefix, meta, key)
            else:
                from ...bundle import prefixfile

                prefixfile.write(tmp, np.zeros(0, np.int64), {}, meta, key)
            tmp.replace(path)  # never a half-written conversation under its name
        except PrefixEdgeError:
            raise
        except Exception as e:  # OSError, safetensors' own error: one line
            if disk_full(e):
                raise PrefixEdgeError(f"{path}: No space left on device") from None
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PrefixEdgeError(f"{path}: cannot write the conversation: {why}") from None
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        return entry is not None

    @classmethod
    def load(cls, rt: "Runtime", path: str | Path, signed: bool = False) -> "Conversation":
        """signed: the file must carry this home's MAC (saved with signed=True here)."""
        from ...bundle import prefixfile

        path = _path(path)
        where = str(path)
        if not path.is_file():
            raise PrefixEdgeError(f"{where}: no saved conversation there")
        # a flipped bit, a symbolic link, a FIFO; signed: a file this home did not write: refused
        tensors, meta = prefixfile.read(path, verify=True, mac_key=_key() if signed else None)
        if meta.get("format") != FORMAT:
            raise PrefixEdgeError(f"{where}: not a saved prefix-edge conversation")
        task = meta.get("task") or None
        messages = _json(meta.get("messages", ""), where, "messages")
        if not isinstance(messages, list):
            raise PrefixEdgeError(f"{where}: its messages are not a list")
        if task is not None and task not in rt.manifest.tasks:
            raise PrefixEdgeError(f"{where}: saved with task {task!r}, which this bundle does not have")
        conv = cls(rt, task)
        if messages:
            try:
                conv.messages = check_messages(messages + [{"role": "user", "content": "x"}])[:-1]
            except PrefixEdgeError as e:
                raise PrefixEdgeError(f"{where}: {e}") from None
        conv.kv_restored = False
        same = (meta.get("fingerprint") == rt.fingerprint and meta.get("prefill_chunk") == str(rt.prefill_chunk)
                and (task is None or meta.get("task_digest") == rt.manifest.task_digest(task)))
        if same and prefixfile.IDS in tensors and len(tensors) > 1 and "turn_ids" in meta:
            ids = _ints(_json(meta["turn_ids"], where, "turn ids"), where, "turn ids")
            cuts = tuple(_ints(_json(meta.get("turn_cuts", ""), where, "turn cuts"), where, "turn cuts"))
            ids = np.array(ids, np.int64)
            last_user = max((i for i, m in enumerate(conv.messages) if m["role"] == "user"), default=-1)
            root, want, want_cuts = conv._prompt_key(conv.messages[:last_user + 1]) if last_user >= 0 \
                else (None, None, None)
            if want is not None and not (np.array_equal(want, ids) and want_cuts == cuts):
                ahead = conv._reply_key(conv.messages)  # saved as its reply read ahead
                if ahead is not None:
                    root, want, want_cuts = ahead
            if want is not None and np.array_equal(want, ids) and want_cuts == cuts:
                prefix = rt.backend.prefix_from(tensors, meta, where)  # checked like a baked prefix
                n_pre = rt.manifest.tasks[task].prefix_tokens if task is not None else 0
                if prefix.n_tokens != n_pre + len(ids):
                    raise PrefixEdgeError(f"{where}: its KV holds {prefix.n_tokens} positions, its "
                                          f"prompt {n_pre + len(ids)}")
                conv.kv_restored = rt.prompts.put(root, ids, cuts, prefix)
                conv._last = (root, ids, cuts)
        return conv


def _key() -> bytes:
    from ...paths import secret_key

    try:
        return secret_key()
    except OSError as e:
        raise PrefixEdgeError(f"cannot sign or check a conversation: {e}") from None


def _path(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise PrefixEdgeError(f"a conversation's file must be a path, got {type(path).__name__}")
    return Path(path)


def _json(text: str, where: str, what: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise PrefixEdgeError(f"{where}: its {what} are not valid JSON") from None


def _ints(value, where: str, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(x) is int and 0 <= x < 1 << 62 for x in value):
        raise PrefixEdgeError(f"{where}: its {what} are not a list of token positions")
    return value
