"""Inputs are capped before they are tokenized: MAX_INPUT_BYTES (the server's body limit, one
definition) for the Python API's text and messages and for the CLI's stdin, of which at most
that + 1 byte is read; an input under the cap but far over the context is counted a chunk at a
time and refused without tokenizing all of it. Each refusal is one PrefixEdgeError line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prefix_edge.errors import ContextLengthExceeded
from prefix_edge.options import MAX_INPUT_BYTES, OptionError, check_text
from prefix_edge.runtime.chat.render import check_messages
from prefix_edge.serve.limits import MAX_BODY


def test_one_definition():
    assert MAX_BODY == MAX_INPUT_BYTES == 4 << 20


def test_check_text_counts_utf8_bytes():
    assert check_text("a" * MAX_INPUT_BYTES, "x") == MAX_INPUT_BYTES
    assert check_text("é" * (MAX_INPUT_BYTES // 2), "x") == MAX_INPUT_BYTES
    for text in ("a" * (MAX_INPUT_BYTES + 1), "é" * (MAX_INPUT_BYTES // 2 + 1), "🚀" * (MAX_INPUT_BYTES // 3)):
        with pytest.raises(OptionError, match="MAX_INPUT_BYTES") as e:
            check_text(text, "the input")
        assert e.value.field == "the input" and "\n" not in str(e.value)


def test_messages_are_capped_together():
    half = "a" * (MAX_INPUT_BYTES // 2)
    check_messages([{"role": "user", "content": half}, {"role": "assistant", "content": half[:-10]},
                    {"role": "user", "content": "ok"}])
    with pytest.raises(OptionError, match="together") as e:
        check_messages([{"role": "user", "content": half}, {"role": "assistant", "content": half},
                        {"role": "user", "content": "ok"}])
    assert e.value.field == "messages"
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": half + half}}]}
    with pytest.raises(OptionError, match="together"):
        check_messages([{"role": "user", "content": "x"}, call, {"role": "tool", "content": "r"}])


def test_runtime_refuses_before_tokenizing(bundle_fp32):
    from prefix_edge import Runtime

    huge = "a" * (100 << 20)  # 100 MB: the CLI input, here through the API
    with Runtime.open(bundle_fp32, backend="gguf", slots=1) as rt:
        for call in (lambda: rt.generate("support", huge), lambda: rt.stream("support", huge),
                     lambda: rt.generate("support", messages=[{"role": "user", "content": huge}]),
                     lambda: rt.generate(None, messages=[{"role": "system", "content": huge[:MAX_INPUT_BYTES]},
                                                          {"role": "user", "content": "hi"}]),
                     lambda: rt.chat("support").send(huge),
                     lambda: rt.chat("support", system=huge).send("hi")):
            with pytest.raises(OptionError, match="MAX_INPUT_BYTES") as e:
                call()
            assert "\n" not in str(e.value)
        # at the cap: refused by the context, counted only as far as the context reaches
        at_cap = "ab " * (MAX_INPUT_BYTES // 3)
        for task in ("support", "raw"):
            with pytest.raises(ContextLengthExceeded, match="counted that far"):
                rt.generate(task, at_cap)
        with pytest.raises(ContextLengthExceeded):
            rt.generate("support", messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                             {"role": "user", "content": at_cap[:-3]}])
        assert rt.generate("support", "my sync stopped", max_tokens=2).text is not None  # still serving


def _cli(args, stdin: bytes) -> tuple[int, str, int]:
    """The real CLI in a child process that reports its own peak RSS (KiB, VmHWM: since its exec,
    unlike getrusage's, which keeps the forking parent's) as it exits."""
    code = ("import atexit, re, runpy, sys\n"
            "atexit.register(lambda: print('MAXRSS', re.search(r'VmHWM:\\s*(\\d+)', "
            "open('/proc/self/status').read()).group(1), file=sys.stderr))\n"
            f"sys.argv = ['prefix-edge', *{list(map(str, args))!r}]\n"
            "runpy.run_module('prefix_edge', run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, timeout=900)
    err = p.stderr.decode()
    rss = int(err.rsplit("MAXRSS", 1)[1].split()[0])
    return p.returncode, err.rsplit("MAXRSS", 1)[0].strip(), rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS from /proc/self/status")
def test_cli_stdin_is_capped(bundle_fp32, tmp_path):
    rc, err, rss = _cli(["run", "--task", "support", "--bundle", bundle_fp32], b"a" * (100 << 20))
    assert rc == 1 and err == f"error: stdin holds more than {MAX_INPUT_BYTES} bytes; an input may be at most 4 MiB"
    assert rss < 512 << 10  # the issue: 12.3 GB before its "too many tokens"
    rc, err, rss = _cli(["run", "--task", "support", "--bundle", bundle_fp32, "--backend", "gguf"],
                        b"ab " * (MAX_INPUT_BYTES // 3))
    assert rc == 1 and "counted that far" in err and len(err.splitlines()) == 1
    assert rss < 1 << 20
    rc, err, _ = _cli(["run", "--chat", "--task", "support", "--bundle", bundle_fp32, "--backend", "gguf"],
                      b"a" * (MAX_INPUT_BYTES + 10) + b"\nhello\n")
    assert rc == 1 and err.splitlines()[-1].startswith("error: a line of stdin holds more than")
    schema = tmp_path / "big-schema.json"
    schema.write_bytes(b"[" + b"1," * MAX_INPUT_BYTES + b"1]")
    rc, err, _ = _cli(["run", "--task", "support", "--bundle", bundle_fp32, "--json-schema", schema, "x"], b"")
    assert rc == 1 and "holds more than" in err and len(err.splitlines()) == 1
