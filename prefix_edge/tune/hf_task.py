"""A task run in transformers at fp32 (+ PEFT for a peft task): the reference that `eval
--reference` scores and the teacher that `distill` copies. It decodes with the runtime's own
Sampler and TextStream, so options (penalties, stops, seeds) mean exactly what they mean in a
bundle; only the model (fp32, no baked KV) differs. torch/transformers/peft are imported here,
never by the runtime."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import PrefixEdgeError
from ..runtime.decode.sampling import Sampler
from ..runtime.decode.text import TextStream
from ..tasks import RenderedTask, TaskSpec, fill_template, render_task


@dataclass
class Generated:
    text: str
    tokens: list[int]
    ttft_ms: float | None
    decode_s: float


class HFTask:
    """`spec` rendered for `base`'s tokenizer, on `base` loaded at fp32 (with `spec`'s adapter)."""

    def __init__(self, spec: TaskSpec, base: Path, n_ctx: int | None = None):
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging
        except ImportError:
            raise PrefixEdgeError("this needs the export extra: pip install 'prefix-edge[export]'") from None
        from ..tasks import prefix_ids
        from ..export.peft import read_adapter
        from ..chat_template import template_specials
        from ..export.source import eos_ids, prepare_hf_dir

        hf_logging.set_verbosity_error()
        self._work = tempfile.TemporaryDirectory(prefix="prefix-edge-hf-")
        hf_dir = prepare_hf_dir(Path(base), Path(self._work.name))
        tok = AutoTokenizer.from_pretrained(str(hf_dir))
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
        chat_template = tok.chat_template if isinstance(tok.chat_template, str) else None
        special = template_specials(tok)
        self.spec, self.hf_dir, self.hf_tokenizer = spec, hf_dir, tok
        self.rendered: RenderedTask = render_task(spec, chat_template, special)
        self.adapter = read_adapter(spec) if spec.kind == "peft" else None
        n_ctx = n_ctx or getattr(model.config, "max_position_embeddings", 2048)
        self.prefix = prefix_ids(tok.backend_tokenizer, self.rendered, spec.name, n_ctx,
                                 self.adapter.n_virtual if self.adapter else 0)
        self.base_model = model
        if self.adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(self.adapter.path)).eval()
        peft_type = getattr(getattr(model, "peft_config", {}).get("default"), "peft_type", None)
        self.peft_type = str(getattr(peft_type, "value", peft_type)) if peft_type is not None else None
        self.torch, self.model, self.tok = torch, model, tok.backend_tokenizer
        self.eos = eos_ids(hf_dir, tok)

    def _generate_inputs(self, ids):
        """(the model whose generate() decodes, its inputs) for the ids `ids`. PEFT 0.21's own
        generate() decodes another model under transformers 5: it drops a prefix-tuning adapter's
        prefix (decoding as the base model) and a soft prompt's after the first token; the base
        model's generate() given the adapter's prefix KV as its cache, or the soft prompt's
        embeddings before the text's, decodes what PeftModel.forward computes (tests/test_peft.py)."""
        torch = self.torch
        if self.peft_type in ("PREFIX_TUNING", "CARTRIDGE"):
            past = self.model.get_prompt(batch_size=1)
            mask = torch.ones(1, past.get_seq_length() + ids.shape[1], dtype=torch.long)
            return self.base_model, {"input_ids": ids, "past_key_values": past, "attention_mask": mask}
        if self.peft_type in ("PROMPT_TUNING", "P_TUNING"):
            embeds = self.base_model.get_input_embeddings()(ids)
            embeds = torch.cat([self.model.get_prompt(batch_size=1).to(embeds.dtype), embeds], dim=1)
            mask = torch.ones(1, embeds.shape[1], dtype=torch.long)
            return self.base_model, {"inputs_embeds": embeds, "attention_mask": mask}
        return self.model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    @property
    def prefix_positions(self) -> int:
        return len(self.prefix) + (self.adapter.n_virtual if self.adapter else 0)

    def close(self) -> None:
        self._work.cleanup()

    def input_ids(self, text: str) -> list[int]:
        """The wrapped input's ids, as the runtime encodes input that spells no special token."""
        r = self.rendered
        full = r.input_before + fill_template(r.template, text) + r.input_after
        return self.tok.encode(full, add_special_tokens=False).ids

    def generate(self, text: str, opts: dict) -> Generated:
        """Decode `text` with the resolved options `opts` (options.resolve: defaults + task)."""
        from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        torch = self.torch
        ids = torch.tensor([self.prefix + self.input_ids(text)])
        n_in, eos = ids.shape[1], set(self.eos)
        stream = TextStream(self.tok, list(opts["stop"]))
        sampler = Sampler.from_options(opts)
        state = {"chunks": [], "tokens": [], "t_first": None, "skip": n_in}

        class Choose(LogitsProcessor):  # the runtime's Sampler picks; generate() takes its pick
            def __call__(self, input_ids, scores):
                tok = sampler(scores[0].float().numpy())
                out = torch.full_like(scores, -float("inf"))
                out[0, tok] = 0.0
                return out

        class Stop(StoppingCriteria):  # EOS, then the runtime's detokenizer and stop strings
            def __call__(self, input_ids, scores, **kw):
                done = False
                for t in input_ids[0, state["skip"] + len(state["tokens"]):].tolist():
                    if state["t_first"] is None:
                        state["t_first"] = time.perf_counter()
                    state["tokens"].append(t)
                    if t in eos:
                        done = True
                        break
                    state["chunks"].append(stream.push(t))
                    if stream.stopped:
                        done = True
                        break
                return torch.tensor([done])

        # no max_tokens (nor the task's): to the end of the context, as the runtime
        limit = opts["max_tokens"] or max(1, getattr(self.model.config, "max_position_embeddings", 4096) - n_in)
        t0 = time.perf_counter()
        with torch.no_grad():
            model, inputs = self._generate_inputs(ids)
            if "inputs_embeds" in inputs:
                state["skip"] = 0  # generate() then returns the new tokens only
            model.generate(**inputs, do_sample=False, max_new_tokens=limit, eos_token_id=self.eos,
                           pad_token_id=self.eos[0], logits_processor=LogitsProcessorList([Choose()]),
                           stopping_criteria=StoppingCriteriaList([Stop()]))
        end, t_first = time.perf_counter(), state["t_first"]
        text_out = "".join(state["chunks"]) + stream.flush()
        n = len(state["tokens"])
        return Generated(text_out, state["tokens"], (t_first - t0) * 1e3 if t_first else None,
                         end - t_first if t_first and n > 1 else 0.0)
