"""OpenAI request fields → the runtime's generation options, each checked with the field named."""

from __future__ import annotations

from typing import Any

from ..options import CONSTRAINTS, OptionError, check as check_options


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = "invalid_request_error" if status < 500 else "server_error"


def _int(body: dict, key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ApiError(400, f"`{key}` must be an integer in [{lo}, {hi}], got {v!r}", key)
    return v


def completion_params(body: dict, chat: bool = True) -> tuple[dict[str, Any], bool, bool, int]:
    """(runtime options, stream, include_usage, n) of a body whose fields are known
    (fields.refuse_unknown: COMPLETION_FIELDS' keys; those not read here do not change the answer)."""
    n = _int(body, "n", 1, 128) or 1
    for key in ("audio", "prediction", "web_search_options"):
        if body.get(key) is not None:
            raise ApiError(400, f"`{key}` is not supported by this server", key)
    if body.get("functions") or body.get("function_call") not in (None, "none"):
        key = "functions" if body.get("functions") else "function_call"
        raise ApiError(400, f"`{key}` (the legacy functions API) is not supported: use `tools`", key)
    mod = body.get("modalities")
    if mod is not None and mod != ["text"]:
        raise ApiError(400, "`modalities`: this server answers text only ([\"text\"])", "modalities")
    if body.get("echo") or body.get("suffix") or (body.get("best_of") or 1) != 1:
        key = next(k for k in ("echo", "suffix", "best_of") if body.get(k))
        raise ApiError(400, f"`{key}` is not supported by this server", key)
    logprobs = _logprobs(body, chat)
    opts: dict[str, Any] = {"logprobs": logprobs, **response_format(body.get("response_format")),
                            "tools": body.get("tools"), "tool_choice": body.get("tool_choice"),
                            "documents": body.get("documents"),
                            "compose_documents": body.get("compose_documents"),
                            "compose_recompute": body.get("compose_recompute")}
    ptc = body.get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise ApiError(400, "`parallel_tool_calls` must be true or false", "parallel_tool_calls")
    opts.update(sampling_options(body))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "`stream` must be true or false", "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise ApiError(400, "`stream_options` must be an object", "stream_options")
    include_usage = bool((so or {}).get("include_usage", False))
    return {k: v for k, v in opts.items() if v is not None}, stream, include_usage, n


# OpenAI's sampling fields that are this runtime's generation options of the same name
# (options.py: one type, range and default each, shared with task files, the CLI and the API)
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "logit_bias", "speculative")


def sampling_options(body: dict) -> dict[str, Any]:
    """The body's sampling fields, checked as generation options (max_completion_tokens, or
    the older max_tokens, is max_tokens)."""
    mt = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    given = {k: body.get(k) for k in SAMPLING}
    given["max_tokens"] = body.get(mt)
    try:
        return {k: v for k, v in check_options(given).items() if v is not None}
    except OptionError as e:
        raise api_error(e, {"max_tokens": mt}) from None


def api_error(e: OptionError, names: dict[str, str] | None = None) -> ApiError:
    """A generation option's error as the 400 naming the request's field (a constraint's is
    response_format's)."""
    field = (names or {}).get(e.field, e.field)
    msg = str(e)
    if msg.startswith(e.field):
        msg = f"`{field}`{msg[len(e.field):]}"
    return ApiError(400, msg, "response_format" if e.field in CONSTRAINTS else field)


def _logprobs(body: dict, chat: bool) -> int | None:
    """Alternatives per token to report, or None: chat's logprobs (bool) + top_logprobs (0-20),
    completions' logprobs (0-5)."""
    if not chat:
        return _int(body, "logprobs", 0, 5)
    lp = body.get("logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise ApiError(400, "`logprobs` must be true or false", "logprobs")
    top = _int(body, "top_logprobs", 0, 20)
    if top is not None and not lp:
        raise ApiError(400, "`top_logprobs` needs `logprobs: true`", "top_logprobs")
    return (top or 0) if lp else None


def chat_messages(body: dict) -> list:
    """The request's messages (their roles and contents are checked by the runtime, which
    names messages[i] in its error)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise ApiError(400, "`messages` must be a non-empty list of {role, content} objects", "messages")
    return msgs


def response_format(rf, field: str = "response_format") -> dict[str, Any]:
    """OpenAI's response_format (text, json_object, json_schema) and this server's extensions
    (regex, grammar: a Lark grammar) → the runtime's constraint option."""
    if rf is None:
        return {}
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ApiError(400, f"`{field}` must be an object with a `type`", field)
    kind = rf["type"]
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": True}
    if kind == "json_schema":
        spec = rf.get("json_schema", rf)  # chat completions nest it; the Responses API does not
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            return {"json_schema": True}
        if not isinstance(schema, dict):
            raise ApiError(400, f"`{field}.json_schema.schema` must be a JSON schema object", field)
        return {"json_schema": schema}
    if kind in ("regex", "grammar"):
        v = rf.get(kind)
        if not isinstance(v, str) or not v:
            raise ApiError(400, f"`{field}.{kind}` must be a non-empty string", field)
        return {kind: v}
    raise ApiError(400, f"`{field}.type` must be text, json_object, json_schema, regex or grammar, "
                   f"got {kind!r}", field)
