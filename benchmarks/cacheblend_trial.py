"""Trial: which document tokens should a composed request recompute? First-k (the shipped rule,
EPIC's LegoLink) against CacheBlend's rule (the tokens whose KV deviates most after the first
layers), at equal recompute budgets, on the real Qwen2.5-Coder-1.5B-Instruct (issue 47 item 5).

Why a trial in transformers and not in the engines: the shipped rule recomputes each document's
first k tokens, a contiguous run, which both engines can prefill in place. CacheBlend's tokens
are scattered through a document: recomputing them needs attention at chosen positions over a
KV that holds later positions too (a mask per query), which neither llama.cpp's sequence API nor
the own ONNX graph's GroupQueryAttention (causal over a contiguous past) offers. So this script
asks first whether the rule is worth building: it runs the model layer by layer by hand (the
weights are transformers' de-quantization of the same GGUF the engines run, fp32), with every
layer's KV either taken from the cache (each document computed once after the head, alone, its
keys re-rotated to where it now stands: what compose.py splices) or recomputed for a set of
positions S (attention of S's queries over all positions before them).

Per doc-QA item (benchmarks/doc_qa.py's items, same seed) and variant, 16 greedy tokens:
- prefilled: S = every position, every layer (checked against the model's own forward);
- first-k: S = labels, each document's first k tokens (the first document spliced whole), tail:
  the shipped composed path;
- cacheblend r: layers 0..B-1 recompute every position after the head; at layer B-1 each
  document token's deviation (|K - K_cached|^2 + |V - V_cached|^2, summed over heads) ranks it;
  from layer B on S = labels, tail and the top r of document tokens.
Reported: answers equal to prefilled, accuracy, and the recompute cost as a fraction of the
prefill of the same positions (token-layers recomputed / token-layers of a prefill; the
quadratic attention term left out, both sides alike).

    python benchmarks/cacheblend_trial.py [--items 20] [--out docs/real-qwen-1.5b-cacheblend.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.doc_qa import SYSTEM, item  # noqa: E402
from prefix_edge.runtime.documents.block import block, module  # noqa: E402


def load(gguf: Path):
    import contextlib
    import io

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        m = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    m.eval()
    return tok, m


class Layered:
    """The decoder run layer by layer with a chosen set of positions recomputed per layer."""

    def __init__(self, model):
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb, rotate_half

        self.m, self.inner = model, model.model
        self.rotate_half, self.apply = rotate_half, apply_rotary_pos_emb
        c = model.config
        self.n_h, self.n_kv = c.num_attention_heads, c.num_key_value_heads
        self.hd = c.hidden_size // c.num_attention_heads
        self.L = c.num_hidden_layers
        eos = model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) | {c.eos_token_id}

    def cos_sin(self, pos: torch.Tensor):
        x = torch.zeros(1, dtype=torch.float32)
        cos, sin = self.inner.rotary_emb(x, pos[None])
        return cos[0], sin[0]  # [n, hd]

    def rerotate(self, k: torch.Tensor, delta: int) -> torch.Tensor:
        """k [n_kv, n, hd] rotated at p -> rotated at p + delta (rotations compose)."""
        cos, sin = self.cos_sin(torch.full((k.shape[1],), delta, dtype=torch.long))
        return k * cos[None] + self.rotate_half(k) * sin[None]

    @torch.no_grad()
    def run(self, ids: torch.Tensor, kv: list | None, select) -> tuple[torch.Tensor, list]:
        """ids [N]; kv: per layer (K, V) [n_kv, N, hd] for every position (the cache's values;
        None: nothing cached, every position computed); select(layer, K_new, V_new, S) -> the
        positions to carry on from this layer (a subset of S), or None to keep S.
        Returns the last position's logits and the final per-layer (K, V)."""
        N = len(ids)
        S = torch.arange(N)
        h = self.inner.embed_tokens(ids[None])[0]
        cos_all, sin_all = self.cos_sin(torch.arange(N))
        out = []
        groups = self.n_h // self.n_kv
        for li, layer in enumerate(self.inner.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(len(S), self.n_h, self.hd).transpose(0, 1)
            k = a.k_proj(x).view(len(S), self.n_kv, self.hd).transpose(0, 1)
            v = a.v_proj(x).view(len(S), self.n_kv, self.hd).transpose(0, 1)
            q, k = self.apply(q[None], k[None], cos_all[S][None], sin_all[S][None])
            q, k = q[0], k[0]
            if kv is None:
                K, V = k, v
            else:
                K, V = kv[li][0].clone(), kv[li][1].clone()
                K[:, S], V[:, S] = k, v
            Kx = K.repeat_interleave(groups, 0)
            Vx = V.repeat_interleave(groups, 0)
            scores = (q @ Kx.transpose(1, 2)) * a.scaling  # [n_h, |S|, N]
            mask = torch.arange(N)[None, :] > S[:, None]
            scores = scores.masked_fill(mask[None], float("-inf"))
            att = torch.softmax(scores, dim=-1) @ Vx  # [n_h, |S|, hd]
            h = h + a.o_proj(att.transpose(0, 1).reshape(len(S), -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            out.append((K, V))
            keep = select(li, K, V, S) if select is not None else None
            if keep is not None:
                pick = torch.isin(S, keep)
                S, h = S[pick], h[pick]
        assert S[-1] == N - 1, "the last position is always recomputed"
        logits = self.m.lm_head(self.inner.norm(h[-1:]))[0]
        return logits, out

    @torch.no_grad()
    def greedy(self, logits: torch.Tensor, kv: list, n: int) -> list[int]:
        """Up to n greedy tokens, ended by an end-of-generation token (not returned), as the
        runtime stops."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for li, (K, V) in enumerate(kv):
            cache.update(K[None].contiguous(), V[None].contiguous(), li)
        N = kv[0][0].shape[1]
        toks = [int(logits.argmax())]
        for i in range(n - 1):
            if toks[-1] in self.eos:
                break
            o = self.m(input_ids=torch.tensor([[toks[-1]]]), past_key_values=cache,
                       position_ids=torch.tensor([[N + i]]), use_cache=True)
            toks.append(int(o.logits[0, -1].argmax()))
        return [t for t in toks if t not in self.eos]


def pieces(tok, it: dict) -> dict:
    """The composed layout of compose.py: head, per document its label ("\\n\\n[i]" from the
    second on) and its module's ids, the tail; each tokenized on its own."""
    docs = it["documents"]
    msgs = [{"role": "system", "content": SYSTEM + "\n\n" + block(docs)},
            {"role": "user", "content": it["question"]}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    mods = [module(d) for d in docs]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    at = text.index(mods[0])
    head = enc(text[:at])
    parts, rest = [], text[at:]
    for i, md in enumerate(mods):
        label = "" if i == 0 else f"\n\n[{i + 1}]"
        assert rest.startswith(label + md), (label, rest[:40])
        parts.append((enc(label) if label else [], enc(md)))
        rest = rest[len(label + md):]
    return {"head": head, "docs": parts, "tail": enc(rest)}


def trial(lay: Layered, tok, it: dict, ks: list[int], rs: list[float], blend_layers: int, n_out: int,
          sink: int = 0) -> dict:
    p = pieces(tok, it)
    head = p["head"]
    ids, doc_spans, label_pos = list(head), [], []
    for label, d in p["docs"]:
        label_pos += range(len(ids), len(ids) + len(label))
        ids += label
        doc_spans.append((len(ids), len(d)))
        ids += d
    tail_start = len(ids)
    ids += p["tail"]
    N, H = len(ids), len(head)
    t_ids = torch.tensor(ids)
    row = {"gold": it["gold"], "tokens": N, "head": H}

    t0 = time.perf_counter()
    logits, full_kv = lay.run(t_ids, None, None)
    ref = lay.greedy(logits, full_kv, n_out)
    row["prefilled"] = tok.decode(ref)
    row["prefilled_s"] = round(time.perf_counter() - t0, 2)

    # the cache: each document computed once after the head, alone, then moved to where it stands
    cached = [(torch.zeros(lay.n_kv, N, lay.hd), torch.zeros(lay.n_kv, N, lay.hd)) for _ in range(lay.L)]
    for li in range(lay.L):
        cached[li][0][:, :H] = full_kv[li][0][:, :H]  # the head: prefilled, exact
        cached[li][1][:, :H] = full_kv[li][1][:, :H]
    for (start, n), (_, d) in zip(doc_spans, p["docs"]):
        _, alone = lay.run(torch.tensor(head + d), None, None)
        for li, (K, V) in enumerate(alone):
            cached[li][0][:, start:start + n] = lay.rerotate(K[:, H:], start - H)
            cached[li][1][:, start:start + n] = V[:, H:]
    new = N - H  # positions after the head: what a prefill of them costs (token-layers: new * L)

    def fixed(keep: torch.Tensor):
        def select(li, K, V, S):
            return keep if li == 0 else None
        return select

    def decode(select, cost: float, name: str):
        t = time.perf_counter()
        lg, kv = lay.run(t_ids, cached, select)
        row[name] = tok.decode(lay.greedy(lg, kv, n_out))
        row[name + "_cost"] = round(cost, 4)
        row[name + "_s"] = round(time.perf_counter() - t, 2)

    always = set(label_pos) | set(range(tail_start, N))
    sinks = {s + j for i, (s, n) in enumerate(doc_spans) if i > 0 for j in range(min(sink, n))}
    for k in ks:
        keep = set(always)
        for i, (start, n) in enumerate(doc_spans):
            if i > 0:
                keep |= set(range(start, start + min(k, n)))
        keep_t = torch.tensor(sorted(keep))
        # layer 0 reads S = every position and keeps `keep` after it: recomputing layer 0 for the
        # cached positions changes nothing (layer 0's KV does not depend on context but for the
        # rotary, re-applied exactly), so this is the first-k path; costed as |keep| per layer
        decode(fixed(keep_t), len(keep) / new, f"k{k}")

    doc_pos = torch.tensor([s + j for i, (s, n) in enumerate(doc_spans) for j in range(n)])
    n_docs_tok = len(doc_pos)
    for r in rs:
        n_pick = int(round(r * n_docs_tok))

        def select(li, K, V, S, n_pick=n_pick):
            if li != blend_layers - 1:
                return None
            dev = ((K[:, doc_pos] - cached[li][0][:, doc_pos]) ** 2).sum((0, 2)) + \
                  ((V[:, doc_pos] - cached[li][1][:, doc_pos]) ** 2).sum((0, 2))
            top = doc_pos[torch.topk(dev, n_pick).indices]
            return torch.tensor(sorted(always | sinks | set(top.tolist())))

        n_keep = len(always | sinks) + n_pick
        cost = (blend_layers * new + (lay.L - blend_layers) * n_keep) / (lay.L * new)
        decode(select, cost, f"cb{int(r * 100)}" + (f"s{sink}" if sink else ""))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None, help="the GGUF (default: the real 1.5B, fetched)")
    ap.add_argument("--items", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--k", default="0,32,64")
    ap.add_argument("--r", default="0.1,0.2,0.3")
    ap.add_argument("--blend-layers", type=int, default=2, help="layers recomputed in full before selecting")
    ap.add_argument("--sink", type=int, default=0,
                    help="cacheblend: each later document's first tokens recomputed too (as first-k's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/real-qwen-1.5b-cacheblend.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.gguf:
        gguf = Path(a.gguf)
    else:
        from tests.helpers.real_models import QWEN25_CODER_1_5B, fetch
        gguf = Path(fetch(QWEN25_CODER_1_5B))
    t = time.perf_counter()
    tok, model = load(gguf)
    print(f"loaded {gguf.name} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    lay = Layered(model)
    ks = [int(x) for x in a.k.split(",")]
    rs = [float(x) for x in a.r.split(",")]

    # the hand-run layers are the model: the last position's logits equal its own forward's
    it0 = item(a.seed * 1000)
    p = pieces(tok, it0)
    ids = torch.tensor(p["head"] + sum((lab + d for lab, d in p["docs"]), []) + p["tail"])
    with torch.no_grad():
        own = model(input_ids=ids[None]).logits[0, -1]
    mine, _ = lay.run(ids, None, None)
    err = float((own - mine).abs().max())
    assert err < 1e-3 and int(own.argmax()) == int(mine.argmax()), err
    print(f"layer-by-layer forward == model forward (max |dlogit| {err:.2e})", file=sys.stderr)

    rows = []
    for i in range(a.items):
        rows.append(trial(lay, tok, item(a.seed * 1000 + i), ks, rs, a.blend_layers, 16, a.sink))
        r = rows[-1]
        print(f"item {i}: {r['tokens']} tokens; prefilled {r['prefilled']!r}; " +
              "; ".join(f"{v} {r[v] == r['prefilled']}" for v in [f"k{k}" for k in ks] +
                        [f"cb{int(x * 100)}" + (f"s{a.sink}" if a.sink else "") for x in rs]), file=sys.stderr)
    names = [f"k{k}" for k in ks] + [f"cb{int(x * 100)}" + (f"s{a.sink}" if a.sink else "") for x in rs]
    summary = {"prefilled": {"accuracy": round(np.mean([r["gold"].lower() in r["prefilled"].lower() for r in rows]), 3)}}
    for n in names:
        summary[n] = {
            "agreement": round(float(np.mean([r[n] == r["prefilled"] for r in rows])), 3),
            "accuracy": round(float(np.mean([r["gold"].lower() in r[n].lower() for r in rows])), 3),
            "recompute_cost": round(float(np.median([r[n + "_cost"] for r in rows])), 3),
        }
        print(f"{n:>6}: agreement {summary[n]['agreement']:.2f}, accuracy {summary[n]['accuracy']:.2f}, "
              f"cost {summary[n]['recompute_cost']:.3f} of a prefill", file=sys.stderr)
    report = {"date": time.strftime("%Y-%m-%d"), "model": gguf.name, "items": a.items, "seed": a.seed,
              "blend_layers": a.blend_layers, "threads": a.threads, "check_max_dlogit": err,
              "machine": platform.processor() or platform.machine(), "summary": summary, "rows": rows}
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
