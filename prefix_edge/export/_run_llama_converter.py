"""Child process of llama_convert.convert: llama.cpp's convert_hf_to_gguf.py, with one change.

    python -m prefix_edge.export._run_llama_converter CONVERTER_DIR HF_DIR [converter options]

Two changes, both where llama.cpp's converter has to guess:
- where llama.cpp does not recognise the BPE pre-tokenizer by its hash (a tokenizer it has not
  seen), tokenizer.json's pre_tokenizer is mapped onto the llama.cpp name that splits the same
  way (export/gguf.py);
- where neither tokenizer_config.json nor the post-processor says whether BOS/EOS are added,
  the file says what transformers' tokenizer does (llama.cpp would otherwise apply its own
  default per pre-tokenizer, e.g. a BOS for "llama-bpe" that transformers does not add).
Everything else is llama.cpp's converter as it ships.
"""

from __future__ import annotations

import logging
import runpy
import sys
from pathlib import Path


def main() -> None:
    conv, hf_dir = Path(sys.argv[1]), Path(sys.argv[2])
    sys.path[:0] = [str(conv), str(conv / "gguf-py")]
    import conversion.base as base

    from ..errors import PrefixEdgeError
    from .gguf import pre_tokenizer_name

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        log = logging.getLogger("hf-to-gguf")
        level, log.level = log.level, logging.ERROR  # its banner for an unknown hash
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return pre_tokenizer_name(Path(self.dir_model))
        finally:
            log.setLevel(level)

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    import gguf

    add_to_gguf = gguf.SpecialVocab.add_to_gguf

    def add_with_defaults(self, gw, quiet: bool = False) -> None:
        if "bos" not in self.add_special_token or "eos" not in self.add_special_token:
            bos, eos = _transformers_adds(hf_dir)
            self.add_special_token.setdefault("bos", bos)
            self.add_special_token.setdefault("eos", eos)
        return add_to_gguf(self, gw, quiet=quiet)

    gguf.SpecialVocab.add_to_gguf = add_with_defaults
    sys.argv = [str(conv / "convert_hf_to_gguf.py"), *sys.argv[2:]]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except PrefixEdgeError as e:
        print(f"prefix-edge: {e}", file=sys.stderr)
        sys.exit(1)


def _transformers_adds(hf_dir: Path) -> tuple[bool, bool]:
    """Whether transformers' tokenizer of hf_dir adds BOS / EOS to a plain encode."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    bare = tok.encode("a", add_special_tokens=False)
    ids = tok.encode("a")
    return (tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id] and bare[:1] != ids[:1],
            tok.eos_token_id is not None and ids[-1:] == [tok.eos_token_id] and bare[-1:] != ids[-1:])


if __name__ == "__main__":
    main()
