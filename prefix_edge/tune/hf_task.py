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
        self.torch, self.model, self.tok = torch, model, tok.backend_tokenizer
        self.eos = eos_ids(hf_dir, tok)

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
        state = {"chunks": [], "tokens": [], "t_first": None}

        class Choose(LogitsProcessor):  # the runtime's Sampler picks; generate() takes its pick
            def __call__(self, input_ids, scores):
                tok = sampler(scores[0].float().numpy())
                out = torch.full_like(scores, -float("inf"))
                out[0, tok] = 0.0
                return out

        class Stop(StoppingCriteria):  # EOS, then the runtime's detokenizer and stop strings
            def __call__(self, input_ids, scores, **kw):
                done = False
                for t in input_ids[0, n_in + len(state["tokens"]):].tolist():
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
            self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=limit, eos_token_id=self.eos,
                                pad_token_id=self.eos[0], logits_processor=LogitsProcessorList([Choose()]),
                                stopping_criteria=StoppingCriteriaList([Stop()]))
        end, t_first = time.perf_counter(), state["t_first"]
        text_out = "".join(state["chunks"]) + stream.flush()
        n = len(state["tokens"])
        return Generated(text_out, state["tokens"], (t_first - t0) * 1e3 if t_first else None,
                         end - t_first if t_first and n > 1 else 0.0)
