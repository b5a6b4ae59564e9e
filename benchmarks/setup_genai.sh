#!/usr/bin/env bash
# The onnxruntime-genai peer needs its own virtualenv: its model builder imports classes only
# transformers 5 has, and optimum-onnx (prefix-edge's exporter) pins transformers < 4.58.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv-genai
.venv-genai/bin/pip install --quiet torch==2.13.0
.venv-genai/bin/pip install --quiet onnxruntime-genai "transformers>=5" onnx onnx-ir onnxruntime numpy
