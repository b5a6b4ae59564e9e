"""`prefix-edge run --task NAME [INPUT]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import PrefixEdgeError
from ..options import FIELDS, MAX_INPUT_BYTES
from .app import app


def _help(name: str) -> str:
    """An option's range and meaning, from its one definition (options.py)."""
    f = FIELDS[name]
    return f"{f.range}{f'; {f.help}' if f.help else ''} (default: the task's, else {f.default})."


def read_input(text: Optional[str]) -> str:
    """INPUT, or stdin: at most MAX_INPUT_BYTES of it are read (one byte more is refused)."""
    if text is not None and text != "-":
        return text
    if sys.stdin is None or sys.stdin.isatty():
        raise PrefixEdgeError("no input: pass INPUT or pipe it on stdin")
    data = _read_capped(sys.stdin.buffer.read, "stdin")
    return _utf8(data, "stdin")


def _read_capped(read, what: str) -> bytes:
    data = read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise PrefixEdgeError(f"{what} holds more than {MAX_INPUT_BYTES} bytes; an input may be at most "
                              f"{MAX_INPUT_BYTES >> 20} MiB")
    return data


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrefixEdgeError(f"{what} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})") from None


@app.command()
def run(
    input: Optional[str] = typer.Argument(None, help="The user's input (default: read stdin)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task name (see `prefix-edge tasks`); with --chat, default: the base model."),
    bundle: Optional[Path] = typer.Option(None, "--bundle", help="Bundle dir (default bundle when omitted)."),
    backend: str = typer.Option("auto", "--backend", help="onnx | gguf | auto (gguf if the bundle has it and llama.cpp runs here, else onnx)."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | metal (gguf) | auto."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Engine threads (default: the physical cores this process may use)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help=_help("max_tokens")),
    temperature: Optional[float] = typer.Option(None, "--temperature", help=_help("temperature")),
    top_p: Optional[float] = typer.Option(None, "--top-p", help=_help("top_p")),
    top_k: Optional[int] = typer.Option(None, "--top-k", help=_help("top_k")),
    seed: Optional[int] = typer.Option(None, "--seed", help=_help("seed")),
    min_p: Optional[float] = typer.Option(None, "--min-p", help=_help("min_p")),
    repetition_penalty: Optional[float] = typer.Option(None, "--repetition-penalty", help=_help("repetition_penalty")),
    presence_penalty: Optional[float] = typer.Option(None, "--presence-penalty", help=_help("presence_penalty")),
    frequency_penalty: Optional[float] = typer.Option(None, "--frequency-penalty", help=_help("frequency_penalty")),
    speculative: Optional[str] = typer.Option(None, "--speculative", help=_help("speculative")),
    no_prefix_cache: bool = typer.Option(False, "--no-prefix-cache", help="Prefill the prefix tokens in the request instead of loading the baked KV (the baseline)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with text, tokens and stats."),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", help="A JSON schema file: the answer is one JSON value of it (constrained decoding)."),
    regex: Optional[str] = typer.Option(None, "--regex", help="The answer matches this regex (constrained decoding)."),
    chat: bool = typer.Option(False, "--chat", help="An interactive conversation: each line you type is a turn (/new starts over, /exit or Ctrl-D ends)."),
    system: Optional[str] = typer.Option(None, "--system", help="--chat: a system message after the task's own."),
    save: Optional[Path] = typer.Option(None, "--save", help="--chat: keep the conversation in this file (written after every turn; resumed from it when it exists)."),
    task_store: Optional[Path] = typer.Option(None, "--task-store", help="Where tasks made at run time are kept (default: the bundle's created/; `prefix-edge task add`)."),
) -> None:
    """Run one task on INPUT, decoding from the task's baked prefix (or chat with --chat)."""
    from ..runtime.runtime import Runtime

    opts = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                min_p=min_p, repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty, use_prefix_cache=not no_prefix_cache,
                json_schema=_schema(json_schema), regex=regex, speculative=speculative)
    if not chat:
        if task is None:
            raise PrefixEdgeError("--task is required (or --chat for a conversation)")
        if system is not None or save is not None:
            raise PrefixEdgeError("--system and --save go with --chat")
    if chat:
        if input is not None or as_json:
            raise PrefixEdgeError("--chat reads its turns from the terminal (no INPUT, no --json)")
        with Runtime.open(bundle, backend=backend, device=device, threads=threads, slots=1,
                          task_store=task_store, mtp_head=speculative == "mtp") as rt:
            return _chat(rt, task, system, save, {k: v for k, v in opts.items() if v is not None})
    text = read_input(input)
    with Runtime.open(bundle, backend=backend, device=device, threads=threads, slots=1, task_store=task_store,
                      mtp_head=speculative == "mtp") as rt:
        if as_json:
            r = rt.generate(task, text, **opts)
            keys = ("prefix_tokens", "input_tokens", "prefix_load_ms", "ttft_ms", "decode_tok_s", "total_ms",
                    "generated_tokens", "finish_reason", "cached_tokens", "drafted_tokens", "accepted_tokens")
            stats = {k: getattr(r.stats, k) for k in keys}
            stats.update(backend=rt.backend.name, threads=rt.threads)
            typer.echo(json.dumps({"text": r.text, "tokens": r.tokens, "stats": stats}, ensure_ascii=False))
            return
        out = sys.stdout
        for chunk in rt.stream(task, text, **opts):
            out.write(chunk)
            out.flush()
        out.write("\n")


def _chat(rt, task: Optional[str], system: Optional[str], save: Optional[Path], opts: dict) -> None:
    """The terminal conversation: a prompt on stderr (when it is a terminal), replies on stdout."""
    tty = sys.stdin is not None and sys.stdin.isatty()
    if save is not None and save.exists():
        conv = rt.resume(save)
        if conv.task != task:
            raise PrefixEdgeError(f"{save} holds a conversation with "
                                  f"{'task ' + repr(conv.task) if conv.task else 'the base model'}; "
                                  "pass that --task or another --save file")
        typer.echo(f"resumed {sum(m['role'] == 'user' for m in conv.messages)} turns from {save}", err=True)
    else:
        conv = rt.chat(task, system=system)
    if tty:
        typer.echo(f"chat with {'task ' + task if task else 'the base model'} "
                   f"({rt.backend.name}); /new starts over, /exit or Ctrl-D ends", err=True)
    while True:
        if tty:
            sys.stderr.write("> ")
            sys.stderr.flush()
        raw = _read_capped(sys.stdin.buffer.readline, "a line of stdin")
        if not raw:
            break
        line = _utf8(raw, "a line of stdin").rstrip("\r\n")
        if line.strip() == "/exit":
            break
        if line.strip() == "/new":
            conv.reset()
            typer.echo("(new chat)", err=True)
            continue
        if not line.strip():
            continue
        s = conv.stream(line, **opts)
        try:
            for chunk in s:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:  # Ctrl-C stops the reply; the conversation goes on
            s.cancel()
            for _ in s:
                pass
        sys.stdout.write("\n")
        sys.stdout.flush()
        if save is not None:
            conv.save(save)


def _schema(path: Optional[Path]):
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return json.loads(_read_capped(f.read, str(path)).decode("utf-8"))
    except FileNotFoundError:
        raise PrefixEdgeError(f"{path}: JSON schema file not found") from None
    except OSError as e:
        raise PrefixEdgeError(f"{path}: cannot read the JSON schema file: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise PrefixEdgeError(f"{path}: not a JSON file: {str(e).splitlines()[0]}") from None
