"""The bundle: the one contract between export and runtime, and the only code that knows its
format. This package: Bundle (bundle.py: an opened bundle, the one object callers use), the
typed manifest (manifest.py), its schema check (check.py), the layout and path confinement
(layout.py), the prefix-file codec (prefixfile.py) and file verification (verify.py).

A bundle is a directory:

    manifest.json                   this file's schema (format_version 1)
    tokenizer/tokenizer.json        the tokenizer (HF tokenizers format)
    onnx/model.onnx[, .onnx_data]   the deployed (quantized) decoder graph
    gguf/model.gguf                 the deployed GGUF model for llama.cpp
    tasks/NAME.onnx.safetensors     per task: per-layer K/V of its prefix + the prefix ids
    tasks/NAME.gguf.safetensors     per task: llama.cpp's sequence-state blob + the prefix ids

A task's prefix occupies positions 0..P-1 (`TaskInfo.prefix_tokens` = P). For a trained (peft)
task the first `n_virtual` of them are virtual tokens, which have no token ids: a prefix file's
`prefix_ids` then hold only the P - n_virtual text ids after them, and its metadata carries
`n_virtual` too. Text tasks have n_virtual = 0.

Every backend has a *fingerprint*: the sha256 of everything a baked prefix depends on (model
file hashes, architecture, layers, KV heads, head dim, RoPE, vocab, tokenizer and chat-template
hashes, KV dtype, and for llama.cpp its state format and V layout). Each prefix file carries
the fingerprint it was baked against in its safetensors metadata; the runtime recomputes the
fingerprint from the files it is about to run and refuses a prefix whose fingerprint differs.
"""

from .bundle import MODEL_SUFFIX, Bundle
from .layout import BACKENDS, MANIFEST, confined
from .manifest import (FORMAT, FORMAT_VERSION, BackendInfo, Manifest, ModelInfo, TaskInfo, TaskPrefixFile,
                       TokenizerInfo)
from .verify import hash_files, sha256_file

__all__ = ["BACKENDS", "Bundle", "MODEL_SUFFIX", "MANIFEST", "confined", "FORMAT", "FORMAT_VERSION", "BackendInfo",
           "Manifest", "ModelInfo", "TaskInfo", "TaskPrefixFile", "TokenizerInfo", "hash_files", "sha256_file"]
