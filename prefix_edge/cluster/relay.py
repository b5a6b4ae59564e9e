"""A replica's answer relayed by the ingress, and what a client gets when the replica dies.

Before the answer's head: a 503 in OpenAI's shape (`replica_failed`, `Retry-After`), a
retryable error the openai SDK retries itself. Mid-stream: the stream ends as the server ends
a stream it cannot finish, never by a cut connection: chat and completions with an
`{"error": {...}}` data frame and `data: [DONE]` (the openai SDK raises it as an APIError);
the Responses API with an `error` event and `response.failed` (the response as created,
`status: "failed"`, its `error`), numbered on from the stream's own sequence numbers.
"""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

CODE = "replica_failed"


def what_failed(e: BaseException) -> str:
    from ray.exceptions import RayActorError

    if isinstance(e, RayActorError):
        return "the replica serving this request stopped (its process died) before it finished"
    return f"the replica serving this request failed ({type(e).__name__}) before it finished"


def unavailable(message: str, replica: str | None = None) -> JSONResponse:
    headers = {"Retry-After": "1"} | ({"x-prefix-edge-replica": replica} if replica else {})
    return JSONResponse({"error": {"message": message + "; retry it", "type": "server_error",
                                   "param": None, "code": CODE}}, status_code=503, headers=headers)


class StreamEnd:
    """Follows an SSE stream as it passes (event count, the Responses API's created response)
    and writes the frames that end it when its replica fails."""

    def __init__(self, path: str):
        self.responses = path.rstrip("/") == "/v1/responses"
        self.events = 0  # complete events so far: their data is JSON on one line
        self.first = b""  # the first event (response.created)
        self.open = False  # the last part ended inside an event

    def saw(self, part: bytes) -> None:
        if self.responses:
            self.events += part.count(b"\n\n")
            if not self.first:
                self.first = part
        self.open = not part.endswith(b"\n\n")

    def frames(self, message: str) -> bytes:
        head = b"\n\n" if self.open else b""  # never glue the end onto a half-sent event
        if not self.responses:
            err = {"error": {"message": message, "type": "server_error", "param": None, "code": CODE}}
            return head + f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
        n = self.events
        out = [_event("error", n, code=CODE, param=None, message=message)]
        created = self._created()
        if created is not None:
            failed = {**created, "status": "failed", "error": {"code": CODE, "message": message}}
            out.append(_event("response.failed", n + 1, response=failed))
        return head + "".join(out).encode()

    def _created(self) -> dict | None:
        for line in self.first.decode("utf-8", "replace").splitlines():
            if line.startswith("data: "):
                try:
                    got = json.loads(line[6:])
                except ValueError:
                    return None
                return got.get("response") if got.get("type") == "response.created" else None
        return None


def _event(kind: str, seq: int, **data) -> str:
    obj = {"type": kind, "sequence_number": seq, **data}
    return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"
