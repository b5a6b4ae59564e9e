"""How a call becomes a scheduler Request (the Runtime's half that runs in the caller's thread):
options resolved and checked, the input tokenized (a task's input wrapping, or a conversation
rendered by the chat template: chat/render.py), the task's prefix loaded, and the prompt cache
consulted (cache/prompts.py) for the longest stored state the prompt starts with. A bad request fails here,
at the call, before anything reaches the engine thread."""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from ..errors import ContextLengthExceeded, PrefixEdgeError, RuntimeClosed
from ..options import DEFAULTS, OptionError, check_text, resolve
from ..tasks import fill_template
from .chat.render import ChatRenderer, check_messages
from .decode.sampling import Sampler
from .scheduler import Call, Request
from .stream import Result, Stats
from .decode.constraint import Grammars
from .documents.plan import DocumentPlan, plan_documents
from .cache.prompts import MIN_TEXT_TOKENS, cache_root
from .engines.kv import Rope
from .engines.protocol import PREFILL_CHUNK
from .decode.text import TextStream, TokenBytes, longer_than
from .chat.tools import ENDED, check_tools, constraint_options, guide, native, read_call, task_call

# use_turn_cache: the prompt cache's earlier name (still accepted)
FLAGS = ("use_prefix_cache", "use_prompt_cache", "use_turn_cache", "raw_special_tokens", "use_constraint")
MAX_TOP_LOGPROBS = 20  # as OpenAI's API


MAX_SCOPE = 1024  # characters of a cache scope


def resident_key(task: str, info) -> str:
    """A task prefix's key among the scheduler's residents: the task, and its prefix's digest
    where it has one (a task made again under its name is another resident)."""
    return f"{task}#{info.prefix_sha256[:16]}" if info.prefix_sha256 else task


def cache_scope(value) -> str:
    """The call's `cache_scope` checked: "" (none: the caches are shared by every call of the
    runtime) or a string that partitions them: a request sees the prompt cache's and the
    document cache's entries of its own scope only (the server's tenant and prompt_cache_key)."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > MAX_SCOPE:
        raise OptionError("cache_scope", f"cache_scope must be a string of at most {MAX_SCOPE} characters, "
                                         f"got {type(value).__name__}")
    return value


class Requests:
    """The caller's-thread half of a Runtime: a call checked and turned into a Request (and its
    choices' siblings, and its Result at the end). It reads the bundle, tokenizer and engine the
    Runtime opened and the two caches the Runtime owns; it submits nothing (the Runtime does)."""

    def __init__(self, bundle, tokenizer, backend, n_ctx: int, prefixes, prompts,
                 prefix_lock, closed) -> None:
        self.bundle, self.manifest = bundle, bundle.manifest
        self.tokenizer, self.backend, self.n_ctx = tokenizer, backend, n_ctx
        self.prefixes, self.prompts = prefixes, prompts  # cache.prefixes / cache.prompts
        self._prefix_lock = prefix_lock                 # guards `prefixes`, shared with the Runtime
        self._closed = closed                           # () -> bool: the Runtime is closed
        self.eos = frozenset(self.manifest.model.eos_token_ids)
        # cells a request that sets no max_tokens (nor its task) may generate into, with its
        # input: None, to the context; llama.cpp's shared_kv: a slot's share of the one cache
        self.open_cells: int | None = None
        self._special_ids = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

    # -- options ------------------------------------------------------------------------
    def options(self, task: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
        unknown = set(overrides) - set(DEFAULTS) - set(FLAGS) - {"logprobs", "tools", "tool_choice"} \
            - {"documents", "compose_documents", "cache_scope"}
        if unknown:
            raise OptionError(sorted(unknown)[0], f"unknown generation option {sorted(unknown)[0]!r}")
        over = {k: v for k, v in overrides.items() if v is not None and k in DEFAULTS}
        defaults = self.manifest.tasks[task].defaults if task is not None else {}
        opts = resolve(defaults, over)
        n_vocab = self._n_vocab
        bad = next((t for t in opts["logit_bias"] if t >= n_vocab), None)
        if bad is not None:
            raise OptionError("logit_bias", f"logit_bias: token id {bad} is outside this model's vocabulary "
                                  f"(0..{n_vocab - 1})")
        return opts

    @functools.cached_property
    def _n_vocab(self) -> int:
        return int(self.backend.n_vocab)

    @functools.cached_property
    def _text_tokenizer(self):
        """A copy of the tokenizer that encodes special tokens as text (for user text that spells
        one; built on first need: serialising the tokenizer costs tens of ms at open)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.tokenizer.to_str())
        tok.encode_special_tokens = True
        return tok

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        return TokenBytes(self.tokenizer)

    @functools.cached_property
    def grammars(self) -> Grammars:
        return Grammars(self.tokenizer, lambda: self.token_bytes, self._n_vocab, sorted(self.eos))

    def _sampler(self, opts: dict, constrain: bool = True, tools=None) -> Sampler:
        sampler = Sampler.from_options(opts)
        if constrain:  # None unless a constraint is asked for (or a task's default)
            # compiled, checked and its first mask computed here, at the call: a bad one is
            # refused before anything streams (errors name the field: tools for a guided call)
            field = "tools" if tools is not None and tools.guided else None
            sampler.constraint = self.grammars.constraint(opts, field)
        return sampler

    @functools.cached_property
    def chat_renderer(self) -> ChatRenderer:
        """The model's chat template (checked against the manifest's hash) and its tokenization."""
        template, special = self.bundle.chat_template()
        added = self.tokenizer.get_added_tokens_decoder()
        texts = [t.content for t in added.values() if t.special and t.content]
        return ChatRenderer(template, special, self.tokenizer, lambda: self._text_tokenizer,
                            texts)

    # -- input --------------------------------------------------------------------------
    def encode_input(self, task: str | None, text: str, raw_special_tokens: bool = False) -> np.ndarray:
        """The task's input wrapping around the user's text, tokenized (task None: the base
        model's prompt, after what the tokenizer itself puts first, a BOS where it has one). The
        user's text never becomes control tokens: if it spells one (`<|im_end|>`...), it is
        encoded as plain text (the wrapping keeps its own special tokens); otherwise the whole
        string is tokenized at once, exactly as export and PEFT tokenize it."""
        info = self.manifest.tasks[task] if task is not None else None
        n_prefix = info.prefix_tokens if info is not None else 0
        room = self.n_ctx - n_prefix  # the most any request gives its input
        if longer_than(self.tokenizer, text, room):
            raise ContextLengthExceeded(f"input is more than {room} tokens (counted that far); " + (
                f"with task '{task}''s prefix of {n_prefix} tokens that exceeds " if info is not None
                else "that exceeds ") + f"the {self.n_ctx} tokens a request may use")
        before, after, lead = self._wrapping(info)
        enc = self.tokenizer.encode(before + text + after, add_special_tokens=False)
        if raw_special_tokens:  # the caller's opt-in: special tokens in the text are parsed
            return np.array(lead + enc.ids, np.int64)
        lo, hi = len(before), len(before) + len(text)
        if not any(a < hi and b > lo and tid in self._special_ids
                   for tid, (a, b) in zip(enc.ids, enc.offsets)):
            return np.array(lead + enc.ids, np.int64)
        ids = lead + (self.tokenizer.encode(before, add_special_tokens=False).ids if before else [])
        ids += self._text_tokenizer.encode(text, add_special_tokens=False).ids
        ids += self.tokenizer.encode(after, add_special_tokens=False).ids if after else []
        return np.array(ids, np.int64)

    def _wrapping(self, info) -> tuple[str, str, list[int]]:
        """(text before the user's text, text after it, ids before both) of a task's input
        (info: its TaskInfo), or of a base-model prompt (info None: the tokenizer's lead)."""
        if info is None:
            return "", "", self._lead
        head, _, tail = fill_template(info.template, "\x00").partition("\x00")
        return info.input_before + head, tail + info.input_after, []

    @functools.cached_property
    def _lead(self) -> list[int]:
        """The ids the tokenizer's post-processor puts before a text (a BOS, or none): a base
        model's prompt starts with them, as transformers' tokenizer(prompt) gives it."""
        a = self.tokenizer.encode("a", add_special_tokens=True).ids
        b = self.tokenizer.encode("a", add_special_tokens=False).ids
        return next((a[:k] for k in range(len(a) - len(b) + 1) if a[k:k + len(b)] == b), [])

    def input_ids(self, ids) -> np.ndarray:
        """Token ids given as the input: checked (the model's vocabulary) and placed after the
        task's prefix as they are (no template wraps them)."""
        out = list(ids)
        if not out:
            raise PrefixEdgeError("the input is an empty list of token ids: nothing to generate from",
                                  param="text")
        for t in out:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < self._n_vocab:
                raise PrefixEdgeError(f"the input's token id {t!r} is not in this model's vocabulary "
                                      f"(0..{self._n_vocab - 1})", param="text")
        return np.array(out, np.int64)

    def chat_input(self, task: str | None, messages: list, tools=None,
                   documents: list | None = None) -> tuple[np.ndarray, tuple[int, ...], list]:
        """(ids after the task's prefix, turn cuts, the checked messages) of a conversation. One
        user message to a task is its input, wrapped exactly as `text=` wraps it. tools: a
        tools.ToolSpec offered to the model; documents: given to a template with a documents
        section of its own (`_native_documents`)."""
        msgs = check_messages(messages)
        if self._task_input(task, msgs, tools):
            return self.encode_input(task, msgs[0]["content"]), (), msgs
        info = self.manifest.tasks[task] if task is not None else None
        room = self.n_ctx - (info.prefix_tokens if info is not None else 0)
        p = self.chat_renderer.prompt(task, info, msgs, room, tools, documents=documents)
        return p.ids, p.cuts, msgs

    def _task_input(self, task: str | None, messages: list, tools) -> bool:
        """One user message to a task: its input, wrapped by the task's template (no chat template)."""
        offered = tools is not None and tools.choice != "none"
        return task is not None and isinstance(messages, list) and len(messages) == 1 and \
            isinstance(messages[0], dict) and messages[0].get("role") == "user" and \
            not (offered and self._chat(task))

    def _native_documents(self, task, messages, tools, docs) -> bool:
        """The documents go to the model's own documents section (its template reads
        `documents`), unless the conversation is a task's text input or a document spells a
        special token (the fallback block then carries it, as message text)."""
        return bool(docs) and self.chat_renderer.template is not None and self.chat_renderer.documents_native \
            and not self._task_input(task, messages, tools) \
            and not any(t in d["title"] + d["text"] for d in docs for t in self.chat_renderer.special_texts)

    # -- the request --------------------------------------------------------------------
    def _chat(self, task: str) -> bool:
        return bool(self.manifest.tasks[task].chat)

    def _tool_options(self, task: str | None, overrides: dict, tools) -> dict:
        """The options with the tools' constraint: a guided call's (tools.guide); for a
        completion-prompt task (chat = false: a trained tool task, which renders no tools) its
        own answer narrowed to the functions offered (tools.task_call), streamed as a call."""
        opts = self.options(task, overrides)
        if tools is not None and tools.choice != "none" and task is not None and not self._chat(task):
            tools.guided = True
            return {**opts, "json_schema": task_call(opts["json_schema"], tools, task), "regex": None,
                    "grammar": None}
        return constraint_options(opts, guide(tools, native(self.chat_renderer.template)))

    def _flag(self, overrides: dict, name: str, default: bool) -> bool:
        v = overrides.get(name, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise PrefixEdgeError(f"{name} must be true or false, got {v!r}", param=name)
        return v

    def request(self, task: str | None, text: str | None, overrides: dict[str, Any],
                 messages: list | None = None, read_ahead: bool = False) -> Request:
        """read_ahead: `messages` end with an assistant's reply and a placeholder user message;
        the request reads the prompt up to the reply's end (the next turn's cut there) and
        keeps its state in the prompt cache for the next turn (reply_prefill)."""
        t0 = time.perf_counter()
        if self._closed():
            raise RuntimeClosed("the runtime is closed")
        if task is not None and (not isinstance(task, str) or task not in self.manifest.tasks):
            raise PrefixEdgeError(f"unknown task {task!r}; this bundle has: "
                                  f"{', '.join(sorted(self.manifest.tasks)) or 'no tasks'}")
        if (text is None) == (messages is None):
            raise PrefixEdgeError("give the input as text or as messages (one of the two)")
        raw = self._flag(overrides, "raw_special_tokens", False)
        use_cache = self._flag(overrides, "use_prefix_cache", True)
        use_prompts = self._flag(overrides, "use_prompt_cache", self._flag(overrides, "use_turn_cache", True)) \
            and use_cache
        logprobs = overrides.get("logprobs")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise PrefixEdgeError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] (the "
                                  f"alternatives per token), got {logprobs!r}", param="logprobs")
        scope = cache_scope(overrides.get("cache_scope"))
        tools = check_tools(overrides.get("tools"), overrides.get("tool_choice"))
        if tools is not None and messages is None:
            raise PrefixEdgeError("tools go with messages (a conversation), not text", param="tools")
        opts = self._tool_options(task, overrides, tools)
        constrain = self._flag(overrides, "use_constraint", True)
        docs = plan_documents(overrides.get("documents"), opts["compose_documents"], opts["compose_recompute"],
                              lambda items: messages is not None and self._native_documents(task, messages, tools, items))
        cuts: tuple[int, ...] = ()
        if messages is None and isinstance(text, (list, tuple, np.ndarray)):  # token ids, as given
            if docs:
                raise OptionError("documents", "documents go with a text input, not token ids")
            ids = self.input_ids(text)
        elif messages is None:
            if not isinstance(text, str):
                raise PrefixEdgeError(f"the input must be a string or token ids, got {type(text).__name__}",
                                      param="text")
            check_text(text, "the input")
            if not text.strip():
                raise PrefixEdgeError("the input is empty: nothing to generate from", param="text")
            text = docs.around_text(text) if docs else text
            ids = self.encode_input(task, text, raw_special_tokens=raw)
        elif docs.native:  # the template's own section
            ids, cuts, _ = self.chat_input(task, messages, tools, documents=docs.given)
        else:
            if docs:
                messages = docs.into_messages(messages, task is not None and
                                              (tools is None or tools.choice == "none" or not self._chat(task)))
            ids, cuts, _ = self.chat_input(task, messages, tools)
        if read_ahead:  # up to the reply's end: the last cut (the placeholder message after it)
            if not cuts or docs:
                raise PrefixEdgeError("nothing to read ahead: the template gives no cut at the reply's end")
            ids, cuts = ids[:cuts[-1]], tuple(cuts[:-1])
        compose = None
        if docs.compose:  # documents/compose.py: opt-in, not exact
            compose = self._composition(task, text, messages, docs, tools, use_cache, scope)
            if compose is not None:
                compose, ids, cuts = compose[0], compose[1], ()
        P = self.manifest.tasks[task].positions(use_cache) if task is not None else 0
        room = self.n_ctx - P - len(ids) - (compose.n_tokens if compose is not None else 0)
        if room < 1:
            what = f"with task '{task}''s prefix of {P} tokens " if task is not None else ""
            raise ContextLengthExceeded(
                f"input is {len(ids)} tokens; {what}that exceeds the {self.n_ctx} tokens a "
                "request may use" + (f" (n_ctx; the model's context is {self.manifest.model.n_ctx})"
                                     if self.n_ctx < self.manifest.model.n_ctx else " (the model's context)"))
        max_tokens = room if opts["max_tokens"] is None else min(opts["max_tokens"], room)
        if opts["max_tokens"] is None and self.open_cells is not None:  # a shared cache: a slot's share
            max_tokens = max(1, min(room, self.open_cells - len(ids) - (compose.n_tokens if compose else 0)))
        if compose is not None:  # nothing composed is exact: no prompt cache either way
            use_prompts = False
        t_load = time.perf_counter()
        root = cache_root(task, scope, self.manifest.tasks[task] if task is not None else None)
        full, full_cuts, hit = ids, cuts, None
        with self._prefix_lock:
            if task is None:
                prefix, key = None, None
            elif use_cache:
                prefix, key = self.prefixes.get(task)[0], resident_key(task, self.manifest.tasks[task])
            else:
                prefix, key = None, None
                if compose is None:  # (a composition's head holds them)
                    pre = self.prefixes.ids(task)
                    # the prefix read as export baked it: in PREFILL_CHUNK pieces, a chunk ending
                    # at its end (protocol.PREFILL_CHUNK): the uncached answer is the baked one
                    at = (*range(PREFILL_CHUNK, len(pre), PREFILL_CHUNK), len(pre)) if len(pre) else ()
                    ids, cuts = np.concatenate([pre, ids]), (*at, *(c + len(pre) for c in cuts))
        if use_prompts:
            hit = self.prompts.lookup(root, full, cuts, P, counted=not read_ahead)
        turn_hit, keep = 0, None
        if hit is not None:  # an earlier prompt's KV up to a chunk end, then only the rest
            prefix, key, turn_hit, keep = hit.prefix, None, hit.n, hit.keep
            ids, cuts = ids[turn_hit:], tuple(c - turn_hit for c in cuts if c > turn_hit)
        load_ms = (time.perf_counter() - t_load) * 1e3 if use_cache else 0.0
        snapshot = compose.keep if compose is not None else None  # its composed state, after its first token
        n_virtual = self.manifest.tasks[task].n_virtual if task is not None else 0
        if use_prompts and self.prompts.wants(len(full), messages is not None) \
                and self.prompts.get(root, full, full_cuts) is None:  # this very prompt is kept already
            snapshot = self._keeper(root, full, full_cuts, n_virtual)
        midpoint, c = None, full_cuts[-1] if full_cuts else 0
        if snapshot is not None and compose is None and not self.prompts.partial and c > turn_hit \
                and c >= MIN_TEXT_TOKENS and self.prompts.get(root, full[:c], full_cuts[:-1]) is None:
            # a state that cannot be cut back serves only where it ends: keep one at the start of
            # the last message too (the same documents or system prompt with a new question);
            # ids and full end together
            midpoint = (len(ids) - (len(full) - c), self._keeper(root, full[:c], full_cuts[:-1], n_virtual))
        call = Call(task, key, prefix, ids, max_tokens, self.eos, prefix_cached=use_cache, load_ms=load_ms,
                    t0=t0, cuts=cuts, prefix_keep=keep, turn_hit=turn_hit, logprobs=logprobs, tools=tools,
                    turn=(root, full, full_cuts) if messages is not None and compose is None else None,
                    speculative=opts["speculative"], background=read_ahead,
                    follow=(task, messages, scope) if messages is not None and compose is None and not read_ahead
                    and tools is None and use_prompts and not docs else None)
        return Request(call, self._sampler(opts, constrain, tools), TextStream(self.tokenizer, list(opts["stop"])),
                       snapshot=snapshot, midpoint=midpoint, compose=compose)

    def _composition(self, task, text, messages, docs: DocumentPlan, tools, use_cache: bool, scope: str = ""):
        """(Composition, the tail ids) of a composed request, or None where its documents cannot
        be told apart in the prompt (a text that spells a special token, a template that
        changes them): it is then prefilled, exact. A model whose keys cannot move: refused."""
        from .documents.compose import Composition, Piece, composition_key
        from .cache.documents import document_key
        why = Rope.refusal(self.manifest.model)
        if why is not None or not self.backend.keeps_partial:
            raise OptionError("compose_documents", "compose_documents: this model's documents cannot be "
                                                   f"composed ({why or 'its state cannot be cut back'}); "
                                                   "leave it false")
        mods = docs.modules
        info = self.manifest.tasks[task] if task is not None else None
        if messages is not None and not self._task_input(task, messages, tools):
            room = self.n_ctx - (info.prefix_tokens if info is not None else 0)
            p = self.chat_renderer.prompt(task, info, check_messages(messages), room, tools, pieces=mods,
                                          documents=docs.given)
            ids, spans = p.ids, p.spans
        else:
            user = text if messages is None else messages[0]["content"]
            got = self._text_spans(info, user, mods)
            if got is None:
                return None
            ids, spans = got
        if len(spans) != len(mods) or spans[-1][1] >= len(ids):
            return None
        with self._prefix_lock:
            pre = np.zeros(0, np.int64) if use_cache or task is None else self.prefixes.ids(task)
        ids = np.concatenate([pre, ids])
        spans = [(a + len(pre), b + len(pre)) for a, b in spans]
        root = cache_root(task, scope, self.manifest.tasks[task] if task is not None else None)
        head = ids[:spans[0][0]]
        pieces, at = [], spans[0][0]
        for a, b in spans:
            pieces.append(Piece(ids[at:a], ids[a:b], document_key(root, head, ids[a:b])))
            at = b
        c = Composition(head, pieces, self.documents, self._rope, docs.recompute, self.prefill_chunk,
                        composition_key(root, head, pieces, docs.recompute))
        return c, ids[at:]

    @functools.cached_property
    def _rope(self) -> Rope:
        """The model's rotary frequencies (composed documents' keys move by them)."""
        return Rope.of(self.manifest.model)

    def _text_spans(self, info, text: str, mods: tuple[str, ...]):
        """A task's (or the base model's) input around `text` tokenized with each of `mods` (in
        `text`, in order) on its own: (ids, spans), or None (text that spells a special token)."""
        if any(t in text for t in self.chat_renderer.special_texts):
            return None
        before, after, lead = self._wrapping(info)
        ids = list(lead)
        full, at, spans = before + text + after, len(before), []
        for m in mods:
            i = full.find(m, at)
            if i < 0:
                return None
            seg = full[at if spans else 0:i]  # what comes before (the first: from the start)
            if seg:
                ids += self.tokenizer.encode(seg, add_special_tokens=False).ids
            s0 = len(ids)
            ids += self._text_tokenizer.encode(m, add_special_tokens=False).ids
            spans.append((s0, len(ids)))
            at = i + len(m)
        ids += self.tokenizer.encode(full[at:], add_special_tokens=False).ids
        return np.array(ids, np.int64), tuple(spans)

    def _keeper(self, root: str, full: np.ndarray, cuts: tuple[int, ...], n_virtual: int):
        """The engine-thread callback that keeps a prompt's KV once it is read."""
        prompts = self.prompts

        def keep(backend, r: Request) -> None:
            text_ids = full if r.call.prefix is None else np.concatenate(
                [r.call.prefix.ids[:max(0, r.pos - len(full) - n_virtual)], full])
            prompts.put(root, full, cuts, backend.seq_snapshot(r.seq, text_ids, n_virtual))
        return keep

    def raw(self, ids, prefix=None, cuts: tuple = (), max_tokens: int = 1, snapshot=None,
            logprobs: int | None = None) -> Request:
        """A greedy request of token ids as given, after `prefix` (None: from an empty
        sequence), no task's options: a created task's bake and its probe (runtime/tasks.py)."""
        call = Call(None, None, prefix, np.asarray(ids, np.int64), max_tokens, self.eos,
                    prefix_cached=prefix is not None, cuts=tuple(cuts), logprobs=logprobs)
        return Request(call, Sampler(), TextStream(self.tokenizer, []), snapshot=snapshot)

    def sibling(self, req: Request, i: int, overrides: dict[str, Any]) -> Request:
        """Choice i of an n > 1 request: the same input, its own sampler (seed + i) and text."""
        c = req.call
        opts = self._tool_options(c.task, overrides, c.tools)
        if opts["seed"] is not None:
            opts["seed"] = (opts["seed"] + i) % 2**63
        call = Call(c.task, None, None, c.ids, c.max_tokens, c.eos, prefix_cached=c.prefix_cached,
                    load_ms=c.load_ms, t0=c.t0, turn_hit=c.turn_hit, logprobs=c.logprobs, tools=c.tools,
                    speculative=c.speculative)
        return Request(call, self._sampler(opts, req.sampler.constraint is not None, c.tools),
                       TextStream(self.tokenizer, list(opts["stop"])), parent=req)

    def result(self, r: Request, finish: str) -> Result:
        end = time.perf_counter()
        n_dec = r.n_samples - 1  # decode steps between the first and the last sampled token
        dec_s = (r.t_last - r.t_first) if r.t_first is not None else 0.0
        call = r.call
        P = self.manifest.tasks[call.task].positions(call.prefix_cached) if call.task is not None else 0
        c = r.compose if r.compose is not None else (r.parent.compose if r.parent is not None else None)
        n_input = call.turn_hit + len(call.ids) + (c.n_tokens if c is not None else 0) - (0 if call.prefix_cached else P)
        cached_from = {"task_prefix": P if call.prefix_cached else 0, "prompt_cache": call.turn_hit,
                       "documents": c.reused if c is not None else 0}
        stats = Stats(
            prefix_tokens=P, input_tokens=n_input,
            prefix_load_ms=round(r.load_ms, 3) if call.prefix_cached else 0.0,
            ttft_ms=round(((r.t_first or end) - call.t0) * 1e3, 3),
            decode_tok_s=round(n_dec / dec_s, 2) if n_dec > 0 and dec_s > 0 else 0.0,
            total_ms=round((end - call.t0) * 1e3, 3), generated_tokens=len(r.tokens),
            prefix_cached=call.prefix_cached, finish_reason=finish,
            cached_tokens=sum(cached_from.values()), cached_from=cached_from,
            drafted_tokens=r.drafter.drafted if r.drafter is not None else 0,
            accepted_tokens=r.drafter.accepted if r.drafter is not None else 0)
        text = "".join(r.chunks)
        return Result(text, list(r.tokens), stats, list(r.token_logprobs), read_call(text, call.tools, finish in ENDED))

