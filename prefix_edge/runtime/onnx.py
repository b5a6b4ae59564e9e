"""ONNX Runtime backend over an optimum `text-generation-with-past` decoder graph.

One session does prefill and decode. A baked prefix is fed as the first `past_key_values`;
the attention mask covers past + new tokens and position ids start at the past length
(positions starting at 0 would give silently wrong logits).

Prefix file (safetensors): `past_key_values.{i}.key|value` [1, n_kv_heads, P, head_dim] in the
graph's KV dtype, `prefix_ids` [P] int64, and metadata {fingerprint, task, backend}.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import PrefixEdgeError
from .backend import Prefix, read_n_virtual, read_prefix_ids

_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def available_devices() -> list[str]:
    import onnxruntime as ort

    provs = ort.get_available_providers()
    return ["cpu"] + (["cuda"] if "CUDAExecutionProvider" in provs else [])


class OnnxBackend:
    name = "onnx"

    def __init__(self, model_path: Path, device: str = "cpu", threads: int | None = None,
                 n_ctx: int = 2048):
        import onnxruntime as ort

        if device == "auto":
            device = "cuda" if "cuda" in available_devices() else "cpu"
        if device == "cuda" and "cuda" not in available_devices():
            raise PrefixEdgeError(
                "device 'cuda' asked for, but this onnxruntime has no CUDA provider "
                "(install prefix-edge[gpu] instead of onnxruntime, with a CUDA driver present)")
        if device not in ("cpu", "cuda"):
            raise PrefixEdgeError(f"the onnx backend runs on 'cpu' or 'cuda', not {device!r}")
        self.device, self.n_ctx = device, n_ctx
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        providers = (["CUDAExecutionProvider"] if device == "cuda" else []) + ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(model_path), opts, providers=providers)
        except Exception as e:  # ORT raises its own types; give one line
            raise PrefixEdgeError(f"cannot load ONNX model {model_path}: {str(e).splitlines()[0]}") from None
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = sorted((n for n in inputs if n.startswith("past_key_values.")),
                                 key=lambda n: (int(n.split(".")[1]), n.endswith("value")))
        if not self.past_names:
            raise PrefixEdgeError(f"{model_path}: not a decoder graph with past_key_values inputs")
        self.present_names = [n.replace("past_key_values.", "present.") for n in self.past_names]
        first = inputs[self.past_names[0]]
        self.n_layers = len(self.past_names) // 2
        self.n_kv_heads, self.head_dim = int(first.shape[1]), int(first.shape[3])
        self.kv_dtype = _ORT_DTYPES[first.type]
        self.has_position_ids = "position_ids" in inputs
        self.output_names = ["logits", *self.present_names]
        self._kv_device = "cuda" if device == "cuda" else "cpu"  # presents stay where ORT made them
        self.past: list[np.ndarray] = []
        self.pos = 0

    # -- prefix files ---------------------------------------------------------------------
    def load_prefix(self, path: Path) -> Prefix:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="np") as f:
                meta = f.metadata() or {}
                names = set(f.keys())
                missing = [n for n in self.past_names + ["prefix_ids"] if n not in names]
                if missing:
                    raise PrefixEdgeError(f"{path}: prefix file lacks tensor {missing[0]}")
                ids = f.get_tensor("prefix_ids").astype(np.int64)
                kv = [f.get_tensor(n) for n in self.past_names]
        except PrefixEdgeError:
            raise
        except Exception as e:
            raise PrefixEdgeError(f"{path}: cannot read prefix file: {e}") from None
        n_virtual = read_n_virtual(meta, str(path))  # trained positions before the ids
        want = (1, self.n_kv_heads, n_virtual + len(ids), self.head_dim)
        for n, t in zip(self.past_names, kv):
            if t.shape != want or t.dtype != self.kv_dtype:
                raise PrefixEdgeError(
                    f"{path}: tensor {n} is {t.dtype}{list(t.shape)}, the model needs "
                    f"{np.dtype(self.kv_dtype)}{list(want)}")
        return Prefix(ids, kv, meta, sum(t.nbytes for t in kv), n_virtual=n_virtual)

    def read_prefix_ids(self, path: Path) -> np.ndarray:
        return read_prefix_ids(path)

    def state_info(self) -> dict:
        """What restoring a prefix depends on beyond the model files (recorded in the manifest)."""
        return {}

    @property
    def kv_dtype_name(self) -> str:
        return np.dtype(self.kv_dtype).name

    def save_prefix(self, path: Path, ids: np.ndarray, metadata: dict[str, str]) -> None:
        """Write the current sequence (a prefilled prefix) as a prefix file."""
        kv = [v if isinstance(v, np.ndarray) else v.numpy() for v in self.past]
        write_prefix(path, ids, dict(zip(self.past_names, kv)), metadata)

    # -- the sequence ---------------------------------------------------------------------
    def begin(self, prefix: Prefix | None) -> None:
        if prefix is None:
            empty = np.zeros((1, self.n_kv_heads, 0, self.head_dim), self.kv_dtype)
            self.past, self.pos = [empty] * len(self.past_names), 0
        else:
            self.past, self.pos = list(prefix.kv), prefix.n_tokens

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        """Append `ids` at the current position; return the last position's logits.

        Runs through an IO binding: the presents stay OrtValues owned by ORT and are bound as
        the next call's past directly, so the KV is never copied out to numpy between steps
        (with plain `run`, every step copies the whole cache once more)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        n = ids.shape[1]
        b = self.session.io_binding()
        b.bind_cpu_input("input_ids", ids)
        b.bind_cpu_input("attention_mask", np.ones((1, self.pos + n), np.int64))
        if self.has_position_ids:
            b.bind_cpu_input("position_ids", np.arange(self.pos, self.pos + n, dtype=np.int64)[None])
        for name, value in zip(self.past_names, self.past):
            if isinstance(value, np.ndarray):
                b.bind_cpu_input(name, value)
            else:
                b.bind_ortvalue_input(name, value)
        b.bind_output("logits", "cpu")
        for name in self.present_names:
            b.bind_output(name, self._kv_device)
        self.session.run_with_iobinding(b)
        out = b.get_outputs()
        self.past, self.pos = out[1:], self.pos + n
        return np.array(out[0].numpy()[0, -1], dtype=np.float32)

    def step(self, token: int) -> np.ndarray:
        return self.prefill(np.array([token], np.int64))

    def close(self) -> None:
        self.session = None
        self.past = []


def write_prefix(path: Path, ids: np.ndarray, kv: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    tensors = {k: np.ascontiguousarray(v) for k, v in kv.items()}
    tensors["prefix_ids"] = np.asarray(ids, np.int64)
    save_file(tensors, str(path), metadata={**metadata, "backend": "onnx"})
