"""The README's and docs/*.md's fenced code blocks, executed, so an example that stops working
fails CI.

Which blocks run:

- ```python blocks run as a script in a subprocess (cwd: a fresh temp dir).
- ```bash / ```sh / ```shell blocks: each command (lines joined at a trailing backslash, split at
  `&&`, `||` and `;` outside quotes) that invokes `prefix-edge`, `python -c` or `curl` runs in
  bash; install and CI steps (pip, venvs, `bash scripts/...`, `bash .ci/run`, pytest, git) are
  skipped, and so is `prefix-edge serve` (a server that keeps running). ```console blocks: the
  `$ ` lines are the commands, the lines after one its expected output.
- Other languages (toml, text, a synopsis without a language) are not executed.

Every block runs against one default bundle (`prefix-edge export`, the README quick start's own
command, run once into a temp $PREFIX_EDGE_HOME by the `home` fixture).

Markers: an HTML comment on the line just before a fence.

- `<!-- doc-test: skip (reason) -->`: the block cannot run in a test (a GPU, a Ray cluster, a
  download, a placeholder path, a new export or a training run, a server that keeps running);
  the test reports it skipped with the reason.
- `<!-- doc-test: server -->`: a client of `prefix-edge serve`: it runs against a server the test
  starts on the default bundle (the text's `127.0.0.1:8080` / `localhost:8080` becomes its port;
  curl gets `--fail-with-body`, so an HTTP error fails the block).

Expected output, asserted where a block shows it: a `# -> TEXT` comment after a line (TEXT must
appear in the output, the comments in order), or a ```text / ```output block right after the block
(only blank lines between: the output, exactly, bar trailing whitespace). Greedy decoding on the
default bundle is deterministic.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py", "python3"}
SHELL = {"bash", "sh", "shell"}
CONSOLE = {"console", "shell-session"}
OUTPUT = {"text", "output"}
BLOCK_TIMEOUT = 600  # seconds per command or script: generous, the machine may be loaded

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`{]*)")
MARK = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<what>[a-z-]+)\s*(?:\((?P<reason>.*)\))?\s*-->\s*$")
ANY_MARK = re.compile(r"<!--\s*doc-test")
EXPECT = re.compile(r"#\s*->\s*(?P<text>.+?)\s*$")
PORTS = re.compile(r"(?:127\.0\.0\.1|localhost):8080")

# Commands the `home` fixture runs once for every block (the README quick start's export).
FIXTURE_COMMANDS = {"prefix-edge export": "the default bundle every block runs on"}


@dataclass
class Block:
    path: Path
    line: int                 # 1-based line of the opening fence
    lang: str
    text: str
    mark: str | None = None   # "skip", "server" or None
    reason: str | None = None
    output: str | None = None  # a following ```text / ```output block
    end: int = 0               # 0-based index of the closing fence's line

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass
class Command:
    text: str
    expect: list[str] = field(default_factory=list)  # `# -> ...` texts
    output: str | None = None                        # console: the lines after `$ cmd`


def parse_blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of a markdown file, with the marker on the line before it and an
    output block that follows it."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m["fence"], m["info"].lower()
        end = i + 1
        while end < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[end]):
            end += 1
        body = "\n".join(lines[i + 1:end]) + "\n"
        block = Block(path, i + 1, lang, body, end=end)
        prev = lines[i - 1] if i > 0 else ""
        if mark := MARK.match(prev):
            block.mark, block.reason = mark["what"], (mark["reason"] or "").strip() or None
        if lang in OUTPUT and blocks and blocks[-1].output is None and blocks[-1].lang not in OUTPUT \
                and all(not s.strip() for s in lines[blocks[-1].end + 1:i]):
            blocks[-1].output = body
        blocks.append(block)
        i = end + 1
    return blocks


def marker_problems(path: Path, text: str | None = None) -> list[str]:
    """Markers that would silently do nothing: not just before a fence of a language that runs,
    an unknown directive, or a skip without its reason."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    problems = []
    for n, line in enumerate(lines):
        if not ANY_MARK.search(line):
            continue
        where = f"{path.name}:{n + 1}"
        m = MARK.match(line)
        nxt = FENCE.match(lines[n + 1]) if n + 1 < len(lines) else None
        if not m:
            problems.append(f"{where}: malformed marker {line.strip()!r}")
        elif m["what"] not in {"skip", "server"}:
            problems.append(f"{where}: unknown directive {m['what']!r}")
        elif m["what"] == "skip" and not (m["reason"] or "").strip():
            problems.append(f"{where}: a skip needs its reason: <!-- doc-test: skip (why) -->")
        elif not nxt:
            problems.append(f"{where}: a marker must be on the line just before a fence")
        elif nxt["info"].lower() not in PYTHON | SHELL | CONSOLE:
            problems.append(f"{where}: marks a {nxt['info'] or 'plain'} block, which never runs")
    return problems


def _split(line: str) -> list[str]:
    """A shell line cut at `&&`, `||` and `;` outside quotes, comments dropped."""
    parts, cur, quote, i = [], "", None, 0
    while i < len(line):
        c = line[i]
        if quote:
            cur += c
            if c == "\\" and quote == '"' and i + 1 < len(line):
                cur += line[i + 1]
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote, cur = c, cur + c
        elif c == "\\" and i + 1 < len(line):
            cur += line[i:i + 2]
            i += 1
        elif c == "#" and (not cur or cur[-1].isspace()):
            break
        elif line.startswith(("&&", "||"), i):
            parts.append(cur)
            cur = ""
            i += 1
        elif c == ";":
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _logical_lines(text: str) -> list[str]:
    out, cur = [], ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        out.append(cur + raw)
        cur = ""
    if cur:
        out.append(cur)
    return out


def shell_commands(block: Block) -> list[Command]:
    if block.lang in CONSOLE:
        cmds: list[Command] = []
        for line in _logical_lines(block.text):
            if line.startswith("$ "):
                cmds.append(Command(line[2:].strip(), output=""))
            elif cmds:
                cmds[-1].output += line + "\n"
        for c in cmds:
            c.expect = [m["text"] for m in [EXPECT.search(c.text)] if m]
        return cmds
    cmds = []
    for line in _logical_lines(block.text):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = _split(line)
        expect = [m["text"] for m in [EXPECT.search(line)] if m]
        cmds += [Command(p) for p in parts]
        if cmds and expect:
            cmds[-1].expect = expect
    return cmds


def classify(cmd: str, server: bool = False) -> str | None:
    """None: run it. Otherwise why it is not run. An unknown command is an error: mark the
    block, or teach this test what the command is. curl runs only in a `server` block (against
    the test's server: self-contained, no network)."""
    try:
        words = shlex.split(cmd)
    except ValueError as e:
        raise AssertionError(f"cannot parse {cmd!r}: {e}") from None
    w = words + ["", "", ""]
    if w[0] == "prefix-edge":
        if cmd in FIXTURE_COMMANDS:
            return f"run once by the home fixture ({FIXTURE_COMMANDS[cmd]})"
        if w[1] == "serve":
            return "a server that keeps running"
        return None
    if w[0] in {"python", "python3"} and w[1] == "-c":
        return None
    if w[0] == "curl":
        if server:
            return None
        raise AssertionError(f"curl outside a <!-- doc-test: server --> block: {cmd!r} (a server "
                             "the test starts, or mark the block skip with a reason)")
    if w[0] in {"pip", "pip3"} or (w[0] in {"python", "python3"} and w[1] == "-m"
                                   and w[2] in {"pip", "venv", "pytest"}):
        return "an install step" if "pytest" not in w[2] else "the test suite itself"
    if w[0] == "mkdocs":
        return "the docs site build (run by .ci/run)"
    if w[0] in {".", "source"} or w[0] == "git" or w[0] == "pytest":
        return "an install or CI step"
    if w[0] in {"bash", "sh"} and (w[1].startswith("scripts/") or w[1] == ".ci/run"):
        return "an install or CI script"
    raise AssertionError(f"unknown command in a doc block: {cmd!r} (mark the block with "
                         "<!-- doc-test: skip (reason) --> or teach tests/test_doc_examples.py)")


def check_output(out: str, expect: list[str], exact: str | None, what: str) -> None:
    pos = 0
    for text in expect:
        found = out.find(text, pos)
        assert found >= 0, f"{what}: expected {text!r} in the output (in order), got:\n{out}"
        pos = found + len(text)
    if exact is not None and exact.strip():
        got = [s.rstrip() for s in out.strip().splitlines()]
        want = [s.rstrip() for s in exact.strip().splitlines()]
        assert got == want, f"{what}: output differs from the documented one:\n--- documented\n" \
                            + "\n".join(want) + "\n--- got\n" + "\n".join(got)


ALL_BLOCKS = [b for p in DOC_FILES for b in parse_blocks(p)]
RUNNABLE = [b for b in ALL_BLOCKS if b.lang in PYTHON | SHELL | CONSOLE]


# --- cheap checks of the markdown and of the conventions (unit tier) ---

def test_markers_are_well_formed():
    problems = [p for path in DOC_FILES for p in marker_problems(path)]
    assert not problems, "\n".join(problems)


def test_the_readme_has_runnable_blocks():
    readme = [b for b in RUNNABLE if b.path.name == "README.md"]
    assert sum(b.mark != "skip" for b in readme) >= 3, [b.id for b in readme]


def test_the_index_links_every_page():
    """docs/index.md lists every page of the site's nav (three were left out once)."""
    import yaml

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from pages(v)
        elif isinstance(node, list):
            for v in node:
                yield from pages(v)
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].join(["nav:\n", ""]))["nav"]
    index = (ROOT / "docs" / "index.md").read_text()
    missing = [p for p in pages(nav) if p != "index.md" and f"]({p}" not in index]
    assert not missing, missing


def test_the_readme_names_every_task_file_key():
    """The README's task-file table names every key the task-file parser accepts."""
    from prefix_edge.tasks.taskfile import ALL_KEYS

    table = "\n".join(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("| `"))
    missing = sorted(k for k in ALL_KEYS if f"`{k}`" not in table)
    assert not missing, missing


def test_conventions_parse():
    md = ("x\n<!-- doc-test: skip (needs a GPU) -->\n```bash\nprefix-edge run --device cuda x\n```\n"
          "```python\nprint(1 + 1)  # -> 2\n```\n\n```text\n2\n```\n"
          "```console\n$ prefix-edge tasks --bundle b \\\n  --json\n{}\n```\n"
          "```bash\npip install x && prefix-edge run --task t \"a && b\"  # -> ok\n```\n")
    b = parse_blocks(ROOT / "x.md", md)
    assert [x.lang for x in b] == ["bash", "python", "text", "console", "bash"]
    assert (b[0].mark, b[0].reason) == ("skip", "needs a GPU") and b[1].output == "2\n"
    [c] = shell_commands(b[3])
    assert c.text == "prefix-edge tasks --bundle b    --json" and c.output == "{}\n"
    cmds = shell_commands(b[4])
    assert [c.text for c in cmds] == ["pip install x", 'prefix-edge run --task t "a && b"']
    assert cmds[1].expect == ["ok"] and classify(cmds[0].text) and classify(cmds[1].text) is None
    assert classify("curl -s http://127.0.0.1:8080/v1/models", server=True) is None
    with pytest.raises(AssertionError, match="server"):
        classify("curl -s https://example.com/x")
    check_output("1\n2\n", ["2"], "1\n2", "t")
    with pytest.raises(AssertionError):
        check_output("3\n", ["2"], None, "t")
    assert marker_problems(ROOT / "x.md", "<!-- doc-test: skip -->\n```bash\n```\n")
    assert marker_problems(ROOT / "x.md", "<!-- doc-test: skip (x) -->\n\n```bash\n```\n")
    assert marker_problems(ROOT / "x.md", "<!-- doc-test: skip (x) -->\n```toml\n```\n")


# --- the blocks themselves, on the real default bundle (e2e tier) ---

def _env(home: Path) -> dict:
    bindir = str(Path(sys.executable).parent)  # the venv's console scripts: prefix-edge
    return {**os.environ, "PREFIX_EDGE_HOME": str(home),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}


@pytest.fixture(scope="module")
def home(default_home) -> Path:
    """The session's default bundle (conftest.py), made by exactly the command the docs give."""
    assert set(FIXTURE_COMMANDS) == {"prefix-edge export"}
    return default_home


@pytest.fixture(scope="module")
def doc_server(home, tmp_path_factory):
    """`prefix-edge serve` on the default bundle, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("doc-server") / "serve.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["prefix-edge", "serve", "--port", str(port)], env=_env(home),
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"prefix-edge serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"server did not start:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _run(argv: list[str], env: dict, cwd: Path, what: str) -> str:
    try:
        p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                           timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what}: still running after {BLOCK_TIMEOUT} s") from None
    assert p.returncode == 0, (f"{what}: exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n"
                               f"--- stderr\n{p.stderr[-3000:]}")
    return p.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_doc_block(block: Block, request, tmp_path):
    if block.mark == "skip":
        pytest.skip(f"{block.id}: {block.reason}")
    home = request.getfixturevalue("home")
    env = _env(home)
    text = block.text
    if block.mark == "server":
        port = request.getfixturevalue("doc_server")
        text = PORTS.sub(f"127.0.0.1:{port}", text)

    if block.lang in PYTHON:
        script = tmp_path / "block.py"
        script.write_text(text, encoding="utf-8")
        out = _run([sys.executable, str(script)], env, tmp_path, block.id)
        expect = [m["text"] for line in text.splitlines() if (m := EXPECT.search(line))]
        check_output(out, expect, block.output, block.id)
        return

    cmds = shell_commands(Block(block.path, block.line, block.lang, text))
    ran, skipped = 0, []
    for i, cmd in enumerate(cmds):
        why = classify(cmd.text, server=block.mark == "server")
        if why:
            skipped.append(f"{cmd.text!r}: {why}")
            continue
        argv = cmd.text
        if shlex.split(argv)[0] == "curl":
            if not shutil.which("curl"):
                skipped.append(f"{cmd.text!r}: curl is not installed")
                continue
            argv = "curl --fail-with-body" + argv[len("curl"):]
        out = _run(["bash", "-c", argv], env, tmp_path, f"{block.id}: {cmd.text}")
        exact = cmd.output if cmd.output is not None else (block.output if i == len(cmds) - 1 else None)
        check_output(out, cmd.expect, exact, f"{block.id}: {cmd.text}")
        ran += 1
    for s in skipped:
        print("not run:", s)
    if not ran:
        pytest.skip(f"{block.id}: nothing to run here ({'; '.join(skipped)})")
