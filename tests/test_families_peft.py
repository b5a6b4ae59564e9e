"""PEFT on the dense 2025-26 families (tests/helpers/families.py): OLMo 2, EXAONE 4.0 (its
sliding window set), Hunyuan dense and ERNIE 4.5, each a tiny seeded checkpoint with a PEFT
prefix-tuning and a prompt-tuning adapter (seeded random init, as `save_pretrained` writes them),
exported once by the default command's formats (`--format onnx,gguf --quantize none
--gguf-quant f32`). On both engines each baked adapter gives PEFT's own first-step logits (ONNX
fp32 to 1e-4; llama.cpp, whose default F16 KV cache rounds the adapter's KV, within 0.1 as in
tests/test_architectures.py) and the same first token; on ONNX the whole greedy continuation is
PEFT's. (The hybrids' prompt tuning: tests/test_hybrid_onnx.py; their prefix tuning is refused.)"""

from __future__ import annotations

import numpy as np
import pytest

from prefix_edge import Runtime

from .helpers.adapters import make_adapter, peft_greedy
from .helpers.families import build_family

pytestmark = pytest.mark.integration
pytest.importorskip("llama_cpp")

N = 6
TASKS = f'''
[task.tuned]
kind = "peft"
adapter = "prefix"
chat = false
max_tokens = {N}

[task.soft]
kind = "peft"
adapter = "prompt"
chat = false
max_tokens = {N}
'''
INPUTS = ["The quick brown fox", "I'm sure they'll say"]
# kind -> build_family's arguments (ERNIE 4.5 as the published 0.3B ships: its SentencePiece
# tokenizer.model, which llama.cpp's converter reads, and no MLP biases, which its graph lacks)
KINDS = {"olmo2": {}, "exaone4": {}, "hunyuan": {}, "ernie4_5": dict(use_bias=False, sentencepiece=True),
         "olmo3": {}, "ministral3": {}}
ATOL = {"onnx": 1e-4, "gguf": 0.1}
_BUILT: dict = {}


@pytest.fixture(scope="module", params=list(KINDS))
def family(request, tmp_path_factory):
    import os
    import subprocess
    import sys

    kind = request.param
    if kind not in _BUILT:
        root = tmp_path_factory.mktemp(f"peft-{kind}")
        model, tok = build_family(kind, root / "model", **KINDS[kind])
        make_adapter(root / "model", "prefix", root / "prefix", seed=4)
        make_adapter(root / "model", "prompt", root / "prompt", seed=3)
        (root / "tasks.toml").write_text(TASKS, encoding="utf-8")
        p = subprocess.run([sys.executable, "-m", "prefix_edge", "export", str(root / "model"), "--tasks",
                            str(root / "tasks.toml"), "--format", "onnx,gguf", "--quantize", "none",
                            "--gguf-quant", "f32", "--out", str(root / "bundle")], capture_output=True,
                           text=True, cwd=root, env={**os.environ, "PREFIX_EDGE_HOME": str(root / "home")})
        assert p.returncode == 0, p.stderr[-2000:]
        _BUILT[kind] = (tok, root)
    return (kind, *_BUILT[kind])


@pytest.mark.parametrize("backend", ["onnx", "gguf"])
@pytest.mark.parametrize("task", ["tuned", "soft"])
def test_baked_adapter_is_peft(family, backend, task):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    kind, tok, root = family
    adapter = {"tuned": "prefix", "soft": "prompt"}[task]
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(root / "model")).eval(),
                                   str(root / adapter)).eval()
    with Runtime.open(root / "bundle", backend=backend) as rt:
        prefix, _ = rt.prefixes.get(task)
        for text in INPUTS:
            ids = tok.encode(text, add_special_tokens=False)
            first, want = peft_greedy(pm, ids, N)
            rt.backend.begin(prefix)
            got = rt.backend.prefill(np.array(ids, np.int64))
            assert np.abs(got - first).max() <= ATOL[backend], (kind, backend, task, text, np.abs(got - first).max())
            assert int(np.argmax(got)) == want[0], (kind, backend, task, text)
            if backend == "onnx":  # fp32 all the way: the whole greedy run (no EOS in the way)
                eos = set(rt.manifest.model.eos_token_ids)
                got_tokens = rt.generate(task, text, max_tokens=N, stop=[]).tokens
                stop = next((i for i, t in enumerate(want) if t in eos), len(want))
                assert got_tokens[:stop] == want[:stop], (kind, task, text)
