"""How the server answers an error a running call met, decided once by its kind
(serve/calls.step_error): the call's own option or anything about the call is the client's
(400, its field named); the engine's failure or a bug is the server's (500)."""

from __future__ import annotations

import pytest

from prefix_edge.errors import ContextLengthExceeded, EngineError, PrefixEdgeError, engine_error
from prefix_edge.options import OptionError
from prefix_edge.serve.calls import step_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("err, status, type_, param", [
    (OptionError("response_format", "response_format: the schema cannot be compiled"), 400,
     "invalid_request_error", "response_format"),
    (OptionError("stop", "stop: too many"), 400, "invalid_request_error", "stop"),
    (PrefixEdgeError("the request needs 900 KV cells, the cache has 512", param="max_tokens"), 400,
     "invalid_request_error", "max_tokens"),
    (ContextLengthExceeded("input is 5000 tokens"), 400, "invalid_request_error", None),
    (EngineError("llama_decode returned -3"), 500, "server_error", None),
    (engine_error(RuntimeError("device lost")), 500, "server_error", None),
    (ValueError("a bug"), 500, "server_error", None),
])
def test_the_kind_decides_the_status(err, status, type_, param):
    got = step_error(err)
    assert (got.status, got.type, got.param) == (status, type_, param)
    assert got.message and "\n" not in got.message


def test_names_follow_the_endpoint_and_engine_errors_keep_their_line():
    got = step_error(OptionError("max_tokens", "max_tokens: too large"), {"max_tokens": "max_output_tokens"})
    assert got.param == "max_output_tokens"
    assert str(engine_error(PrefixEdgeError("llama.cpp refused"))) == "llama.cpp refused"
    assert str(engine_error(KeyError("x"), "internal error")) == "internal error: KeyError: 'x'"
    assert isinstance(engine_error(ValueError()), EngineError)
