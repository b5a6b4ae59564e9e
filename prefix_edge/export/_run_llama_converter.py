"""Child process of llama_convert.convert: llama.cpp's convert_hf_to_gguf.py, with one change.

    python -m prefix_edge.export._run_llama_converter CONVERTER_DIR HF_DIR [converter options]

Three changes, each where llama.cpp's converter has to guess:
- where llama.cpp does not recognise the BPE pre-tokenizer by its hash (a tokenizer it has not
  seen), tokenizer.json's pre_tokenizer is mapped onto the llama.cpp name that splits the same
  way (export/gguf.py);
- where neither tokenizer_config.json nor the post-processor says whether BOS/EOS are added,
  the file says what transformers' tokenizer does (llama.cpp would otherwise apply its own
  default per pre-tokenizer, e.g. a BOS for "llama-bpe" that transformers does not add);
- a dense Nemotron-H saved by transformers 5 carries its config class's expert defaults, which
  the converter reads as the MoE variant: they are dropped when no layer is an expert layer, and
  its per-layer list is given as the pattern string the converter reads dense MLP layers from.
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

    load_hparams = base.ModelBase.load_hparams

    def load_dense_as_dense(dir_model: Path, is_mistral_format: bool):
        return dense_nemotron_h(load_hparams(dir_model, is_mistral_format))

    base.ModelBase.load_hparams = staticmethod(load_dense_as_dense)

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


def dense_nemotron_h(hparams: dict) -> dict:
    """A dense Nemotron-H's config without the expert keys transformers 5 writes into every
    NemotronHConfig (n_routed_experts, num_experts_per_tok ...): llama.cpp's converter takes any
    config holding num_experts_per_tok for the MoE variant and then misplaces the dense MLP
    layers (llama.cpp refuses the GGUF: a tensor "not found")."""
    if hparams.get("model_type") != "nemotron_h" or "moe" in (hparams.get("layers_block_type") or ()) \
            or "E" in (hparams.get("hybrid_override_pattern") or ""):
        return hparams
    experts = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group",
               "routed_scaling_factor", "norm_topk_prob")
    out = {k: v for k, v in hparams.items() if k not in experts and not k.startswith("moe_")}
    if isinstance(out.get("layers_block_type"), list) and not out.get("hybrid_override_pattern"):
        # its list form knows the expert MLP only: the dense MLP layers as the pattern string says them
        letter = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-"}
        out["hybrid_override_pattern"] = "".join(letter.get(t, "?") for t in out["layers_block_type"])
    return out


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
