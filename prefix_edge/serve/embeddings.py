"""POST /v1/embeddings: OpenAI's embeddings request → Runtime.embed → OpenAI's response.

`input`: a string, a list of strings, a list of token ids, or a list of such lists (ids of the
bundle's tokenizer: GET /v1/models says which model). `model`: `base` (the bundle's model; a task
name is refused: a task's prefix steers what the model writes, not what a text means, and
vectors made under different prefixes would not be comparable: docs/embeddings.md).
`encoding_format`: "float" (default) or "base64" (little-endian float32, as OpenAI's).
`dimensions`: only the model's own hidden size (a decoder's hidden state is no Matryoshka
embedding: cutting it is not a smaller embedding). Extensions: `pooling` ("prompt", the default; "mean", "last") and
`normalize` (default true). The body is checked and tokenized in a worker thread, the vectors
made by the runtime's embedder thread (runtime/embedding.py) while the response waits holding
no thread; errors are OpenAI-shaped 4xx naming the field. Limits as for chats: a call over the
embedder's token budget is a 400 naming `input`, a full embeddings queue a 429 with
Retry-After; a client that hangs up has its texts not yet run dropped (counted as a disconnect,
499, in /metrics); /health counts the waiting embeddings.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import Request

from ..errors import PrefixEdgeError, RuntimeBusy, RuntimeClosed
from ..options import OptionError
from ..runtime.embedding import DEFAULT_POOLING
from .calls import BASE_MODEL, DISCONNECTED, admit, disconnected, step_error
from .fields import INT, STR, S, check_fields, read_body
from .schema import ApiError
from .tasks import LiveTasks

ENCODINGS = ("float", "base64")
EMBEDDING_FIELDS = {"model": STR, "input": S("str|list", items=S("str|int|list", items=S("int"))),
                    "encoding_format": STR, "dimensions": INT, "user": STR, "pooling": STR,
                    "normalize": S("bool")}


class Embeddings:
    def __init__(self, rt, metrics, state, error):
        self.rt, self.metrics, self.state, self.error = rt, metrics, state, error
        self.tasks = LiveTasks(rt)  # created and deleted at run time too

    def parse(self, raw: bytes) -> tuple:
        """In a worker thread: (model, the embedder's job, encoding) of a checked body."""
        model = ""
        try:
            body = read_body(raw)
            unknown = sorted(set(body) - set(EMBEDDING_FIELDS))
            if unknown:
                raise ApiError(400, f"unsupported field `{unknown[0]}`", unknown[0])
            check_fields(body, EMBEDDING_FIELDS)
            model = body.get("model")
            if not isinstance(model, str):
                raise ApiError(400, "`model` is required: `base` (GET /v1/models)", "model")
            if self.state.aliases.get(model, model) != BASE_MODEL:  # serve --alias NAME=base
                if model in self.tasks:
                    raise ApiError(400, f"`model`: `{model}` is a task; embeddings come from the base "
                                   f"model only (`model: \"{BASE_MODEL}\"`): a task's prefix steers "
                                   "generation, not what a text means", "model")
                raise ApiError(404, f"the model `{model}` does not exist; embeddings come from "
                               f"`{BASE_MODEL}`", "model", "model_not_found")
            enc = body.get("encoding_format") or "float"
            if enc not in ENCODINGS:
                raise ApiError(400, f"`encoding_format` must be float or base64, got {enc!r}",
                               "encoding_format")
            why = self.rt.embeddings.unsupported()
            if why is not None:  # the bundle's ONNX graph has no hidden states
                raise ApiError(400, why, "model", "embeddings_unsupported")
            size, dims = self.rt.embeddings.dimensions, body.get("dimensions")
            if dims is not None and dims != size:
                raise ApiError(400, f"`dimensions`: this model's embeddings have {size} dimensions; "
                               "other sizes are not supported (a decoder's hidden state is not a "
                               "Matryoshka embedding: a cut one is no smaller embedding)", "dimensions")
            if body.get("input") is None:
                raise ApiError(400, "`input` is required: a string, a list of strings, or token ids",
                               "input")
            pooling = body.get("pooling") or DEFAULT_POOLING
            normalize = body.get("normalize", True)
            try:
                job = self.rt.embeddings.submit(body["input"], pooling,
                                                True if normalize is None else normalize)
            except OptionError as e:
                raise ApiError(400, str(e), e.field) from None
            return model, job, enc
        except (ApiError, RuntimeBusy, RuntimeClosed) as e:
            e.model = model if isinstance(model, str) else ""
            raise

    async def __call__(self, request: Request):
        state, metrics, error = self.state, self.metrics, self.error
        got = await admit(request, state, metrics, error, self.parse)
        if not isinstance(got, tuple):
            return got
        model, job, enc = got
        waiting = asyncio.wrap_future(job.future)
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait([waiting, gone], return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():  # the client hung up: its texts not yet run are dropped
                self.rt.embeddings.cancel(job)
                metrics.count(model, DISCONNECTED)
                metrics.disconnected += 1
                return error(400, "the client disconnected", code="client_disconnected")  # nobody reads it
            vectors = waiting.result()
        except asyncio.CancelledError:
            self.rt.embeddings.cancel(job)
            raise
        except RuntimeClosed as e:
            metrics.count(model, 503)
            return error(503, str(e), "server_error", None, "unavailable", {"Retry-After": "5"})
        except PrefixEdgeError as e:  # 400: about the call itself; 500: the engine's (calls.step_error)
            err = step_error(e)
            metrics.count(model, err.status)
            return error(err.status, err.message, err.type, err.param)
        finally:
            gone.cancel()
        metrics.count(model, 200)
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, enc)}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": job.tokens, "total_tokens": job.tokens}}


def _encode(v: np.ndarray, enc: str):
    if enc == "base64":
        return base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode("ascii")
    return v.tolist()
