"""Child process of llama_convert.convert: llama.cpp's convert_hf_to_gguf.py, with one change.

    python -m prefix_edge.export._run_llama_converter CONVERTER_DIR HF_DIR [converter options]

Five changes, each where llama.cpp's converter has to guess or assumes a 4.x checkpoint:
- where llama.cpp does not recognise the BPE pre-tokenizer by its hash (a tokenizer it has not
  seen), tokenizer.json's pre_tokenizer is mapped onto the llama.cpp name that splits the same
  way (export/gguf.py);
- where neither tokenizer_config.json nor the post-processor says whether BOS/EOS are added,
  the file says what transformers' tokenizer does (llama.cpp would otherwise apply its own
  default per pre-tokenizer, e.g. a BOS for "llama-bpe" that transformers does not add);
- a dense Nemotron-H saved by transformers 5 carries its config class's expert defaults, which
  the converter reads as the MoE variant: they are dropped when no layer is an expert layer, and
  its per-layer list is given as the pattern string the converter reads dense MLP layers from;
- a Granite 4.0-H saved by transformers 5 names its layers "linear_attention" / "full_attention",
  which the converter does not read: they are given in transformers 4's names;
- a Gemma 3n saved by transformers 5 has no k/v projections in its KV-shared layers (unused
  there), which llama.cpp's loader requires: zeros stand in for them.
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

    def load_as_written_before(dir_model: Path, is_mistral_format: bool):
        return granite_h_layer_names(dense_nemotron_h(load_hparams(dir_model, is_mistral_format)))

    base.ModelBase.load_hparams = staticmethod(load_as_written_before)
    model_init = base.ModelBase.__init__

    def init_as_written_before(self, *args, **kwargs) -> None:  # (Mamba2's classes read config.json themselves)
        model_init(self, *args, **kwargs)
        self.hparams = granite_h_layer_names(dense_nemotron_h(self.hparams))

    base.ModelBase.__init__ = init_as_written_before
    index_tensors = base.ModelBase.index_tensors

    def index_with_shared_kv(self, *args, **kwargs):
        return gemma3n_shared_kv(self.hparams, index_tensors(self, *args, **kwargs))

    base.ModelBase.index_tensors = index_with_shared_kv

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


def granite_h_layer_names(hparams: dict) -> dict:
    """A Granite 4.0-H config as transformers 4 wrote it: transformers 5 names its layer_types
    "linear_attention" / "full_attention", and llama.cpp's converter reads "attention" only (it
    would take every layer for a Mamba2 one)."""
    from .onnx_hybrid import GRANITE_H_KINDS

    if hparams.get("model_type") != "granitemoehybrid" or not isinstance(hparams.get("layer_types"), list):
        return hparams
    return {**hparams, "layer_types": [GRANITE_H_KINDS.get(t, t) for t in hparams["layer_types"]]}


def gemma3n_shared_kv(hparams: dict, tensors: dict) -> dict:
    """A Gemma 3n's KV-shared layers with the k/v projections and k norm transformers 5 no longer
    writes (those layers read an earlier layer's KV: the weights are never used) and llama.cpp's
    loader still requires: zeros of their source layer's shapes, so the GGUF loads and computes
    what transformers does (tests/test_gemma3n.py holds it to transformers)."""
    t = hparams.get("text_config") or hparams
    if t.get("model_type") not in ("gemma3n", "gemma3n_text") or not t.get("num_kv_shared_layers"):
        return tensors
    prefix = next((k.split("layers.")[0] for k in tensors if ".layers.0.self_attn.q_proj." in k), None)
    if prefix is None:
        return tensors
    n, shared = int(t["num_hidden_layers"]), int(t["num_kv_shared_layers"])
    out = dict(tensors)
    for i in range(n - shared, n):
        for w in ("k_proj", "v_proj", "k_norm"):
            name, like = f"{prefix}layers.{i}.self_attn.{w}.weight", f"{prefix}layers.0.self_attn.{w}.weight"
            if name not in out and like in out:
                out[name] = (lambda like=like: __import__("torch").zeros_like(tensors[like]()))
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
