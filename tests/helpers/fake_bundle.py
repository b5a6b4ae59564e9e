"""A bundle for the fake engine (fake_engine.py), written in milliseconds without an export: a
Runtime opens on it with `Runtime.open(root, backend="onnx", engine=FakeEngine)` (the fake stands
in for the bundle's "onnx" files: a placeholder model file, its tokenizer, and each task's prefix
baked by the fake itself through the real prefix-file codec, in the manifest as export writes it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from prefix_edge.bundle.manifest import (BackendInfo, Manifest, ModelInfo, TaskInfo, TaskPrefixFile,
                                         TokenizerInfo)

from .fake_engine import EOS, N_VOCAB, SLOT as BACKEND, FakeEngine, tokenizer


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# a chat template in the fake's words: a message is "w1 ROLE-WORD content w2", the reply opens "w3 w4"
CHAT_TEMPLATE = ("{% for m in messages %}w1 {{ {'system': 'w5', 'user': 'w6', 'assistant': 'w4'}[m['role']] }} "
                 "{{ m['content'] }} w2 {% endfor %}{% if add_generation_prompt %}w3 w4 {% endif %}")


def write_bundle(root: Path, tasks: dict[str, str], chat: dict[str, str] | None = None, n_ctx: int = 512,
                 engine: type = FakeEngine) -> Path:
    """A bundle at `root` with the fake's chat template (CHAT_TEMPLATE) whose tasks are text
    prefixes (`tasks`: name -> text of fake words, "w3 w7 ...") and chat tasks (`chat`: name ->
    their system message, the prefix its rendering), each baked by `engine` as export bakes
    (protocol.PREFILL_CHUNK chunks)."""
    from prefix_edge.runtime.engines.protocol import PREFILL_CHUNK

    root.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(unknown="w?")  # prose (a documents block's headings) is a word of its own
    (root / "tokenizer").mkdir(exist_ok=True)
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / BACKEND).mkdir(exist_ok=True)
    (root / BACKEND / "model.onnx").write_bytes(b"a stand-in: the fake engine reads no model file\n")
    be = engine(n_ctx=n_ctx, name=BACKEND)
    model = ModelInfo(architecture="FakeForCausalLM", model_type="llama", n_layers=1, n_heads=1, n_kv_heads=1,
                      head_dim=1, hidden_size=1, vocab_size=N_VOCAB, n_ctx=n_ctx, rope={"theta": 10000.0},
                      eos_token_ids=[EOS], source="tests/helpers/fake_bundle.py")
    m = Manifest(model=model,
                 tokenizer=TokenizerInfo("tokenizer/tokenizer.json", _sha(root / "tokenizer" / "tokenizer.json"),
                                         hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest(), CHAT_TEMPLATE,
                                         {"eos_token": "<eos>"}),
                 backends={BACKEND: BackendInfo({f"{BACKEND}/model.onnx": _sha(root / BACKEND / "model.onnx")},
                                                "float32", "none", state=be.state_info())},
                 tasks={})
    m.backends[BACKEND].fingerprint = fp = m.fingerprint(BACKEND)
    (root / "prefixes").mkdir(exist_ok=True)
    specs = [(name, text, None) for name, text in tasks.items()]
    specs += [(name, f"w1 w5 {system} w2", [{"role": "system", "content": system}])
              for name, system in (chat or {}).items()]
    for name, text, messages in specs:
        ids = np.array(tok.encode(text, add_special_tokens=False).ids, np.int64)
        m.tasks[name] = TaskInfo(kind="text", chat=messages is not None, prefix_tokens=len(ids), input_before="",
                                 input_after="", template="{input}", defaults={}, prefixes={},
                                 chat_messages=messages)
        rel = f"prefixes/{name}.{BACKEND}.safetensors"
        be.begin(None)
        be.prefill(ids, chunk=PREFILL_CHUNK)
        be.save_prefix(root / rel, ids, {"fingerprint": fp, "task": name, "task_digest": m.task_digest(name)})
        m.tasks[name].prefixes[BACKEND] = TaskPrefixFile(rel, _sha(root / rel), (root / rel).stat().st_size, fp)
    m.write(root)
    return root
