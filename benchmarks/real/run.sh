#!/usr/bin/env bash
# The real-model measurements (docs/real-models.md): Qwen2.5-Coder-1.5B-Instruct Q4_K_M, a real
# trained GGUF assembled from the package registry (tests/helpers/real_models.py, sha256 pinned),
# exported GGUF-only with the demo's text tasks (benchmarks/real/tasks.toml), then:
#   bench      TTFT baked vs prefilled, task switch, decode vs plain llama-cpp-python, cold start, RSS
#   doc-qa     composed documents vs the same documents prefilled, at k = 0, 8, 32 (the default), 64
#   lookup     speculative="lookup" on the JSON tasks: tokens per forward, answers equal to "off"
#   embeddings recall@1 on the seeded paraphrase sets
# Each writes docs/real-qwen-1.5b-<step>.json. Run alone on the machine (timings are ratios
# within one run, but another busy process still moves them): about 40 min on 2 cores.
#
#   bash benchmarks/real/run.sh [step ...]     # default: every step
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${PREFIX_EDGE_REAL_OUT:-$HOME/.cache/prefix-edge/real-bundles}"
BUNDLE="$OUT/qwen2.5-coder-1.5b"
STEPS=("${@:-export bench doc-qa lookup embeddings}")
STEPS=(${STEPS[*]})
GGUF="$(python -c 'from tests.helpers.real_models import QWEN25_CODER_1_5B as M, fetch; print(fetch(M))')"
for step in "${STEPS[@]}"; do
    start=$SECONDS
    case "$step" in
        export)
            rm -rf "$BUNDLE"; mkdir -p "$OUT"
            prefix-edge export "$GGUF" --tasks benchmarks/real/tasks.toml --format gguf --out "$BUNDLE" ;;
        bench)
            prefix-edge bench --bundle "$BUNDLE" --backend gguf --prefix-lengths 128,512,1024 --runs 3 \
                --out docs/real-qwen-1.5b-bench.json ;;
        doc-qa)
            python benchmarks/doc_qa.py --bundle "$BUNDLE" --backends gguf --items 20 --k 0,8,32,64 \
                --out docs/real-qwen-1.5b-doc-qa.json ;;
        lookup)
            python benchmarks/speculative.py --bundle "$BUNDLE" --backends gguf --tasks extract,tool_call \
                --inputs 20 --json docs/real-qwen-1.5b-lookup.json ;;
        embeddings)
            python benchmarks/embeddings.py --bundle "$BUNDLE" --recall-only --out docs/real-qwen-1.5b-embeddings.json ;;
        *) echo "run.sh: unknown step '$step' (export bench doc-qa lookup embeddings)" >&2; exit 2 ;;
    esac
    echo "run.sh: $step took $((SECONDS - start)) s" >&2
done
