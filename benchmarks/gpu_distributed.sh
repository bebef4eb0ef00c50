#!/usr/bin/env bash
# The RL recipe under DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 on the GPUs of one machine: a few optimizer steps each with
# the KL reference on (beta > 0: the reference is sharded too), an evaluation, the final save, and a reload of the
# saved model with AleaModel.from_pretrained. One command, offline, a few minutes.
#
# Needs: >= 1 CUDA GPU (bf16-capable), this repo importable (`pip install -e ".[dev]"`, or PYTHONPATH=repo root), and
#        deepspeed for the two ZeRO runs (without it they are reported as "fail"). No network: the quickstart config
#        builds a tiny Qwen3-shaped backbone from a config directory shipped in the repo, and the Hub is forced
#        offline. On one GPU each engine runs one shard (its code paths, not cross-GPU sharding).
#
# Usage:  bash benchmarks/gpu_distributed.sh [zero2 zero3 fsdp]         (default: all three)
# Env:    NUM_GPUS (default: all visible), STEPS (5), RECIPE_CONFIG (recipes/configs/quickstart.yaml),
#         BENCH_DIR (runs/bench_distributed), BENCH_TIMEOUT seconds per run (240), PYTHON (python3, or .venv's),
#         EXTRA_ARGS (appended to every recipe command line, e.g. "--train_mode full").
# Output: one summary line per config, then one JSON line, e.g. {"zero2": "ok", "zero3": "ok", "fsdp": "fail"}
#         (also written to $OUT/gpu_distributed.json when OUT is set). Exit status 0 only if every requested config
#         succeeded. Full logs: $BENCH_DIR/<name>.log.
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

STEPS="${STEPS:-5}"
RECIPE_CONFIG="${RECIPE_CONFIG:-recipes/configs/quickstart.yaml}"
BENCH_DIR="${BENCH_DIR:-runs/bench_distributed}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-240}"
EXTRA_ARGS="${EXTRA_ARGS:-}"

if [ -z "${NUM_GPUS:-}" ]; then
    NUM_GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
fi
if [ "$NUM_GPUS" -lt 1 ]; then
    echo "gpu_distributed.sh: needs a CUDA GPU, found none" >&2
    exit 2
fi
[ "$NUM_GPUS" -eq 1 ] && echo "gpu_distributed.sh: one GPU: each engine runs with one shard" >&2

for f in recipes/rl_env.py "$RECIPE_CONFIG"; do
    if [ ! -f "$f" ]; then
        echo "gpu_distributed.sh: missing $f" >&2
        exit 2
    fi
done

if [ "$#" -gt 0 ]; then
    NAMES=("$@")
else
    NAMES=(zero2 zero3 fsdp)
fi

have_deepspeed=0
if "$PYTHON" -c "import deepspeed" >/dev/null 2>&1; then
    have_deepspeed=1
fi

mkdir -p "$BENCH_DIR"
declare -A RESULT
SUMMARY=()

for name in "${NAMES[@]}"; do
    case "$name" in
        zero2) yaml=accelerate_configs/deepspeed_zero2.yaml ;;
        zero3) yaml=accelerate_configs/deepspeed_zero3.yaml ;;
        fsdp) yaml=accelerate_configs/fsdp.yaml ;;
        *)
            echo "gpu_distributed.sh: unknown config '$name' (choose from zero2 zero3 fsdp)" >&2
            exit 2
            ;;
    esac
    log="$BENCH_DIR/$name.log"
    if [[ "$name" == zero* && "$have_deepspeed" -eq 0 ]]; then
        RESULT[$name]=fail
        SUMMARY+=("$name: fail (deepspeed is not installed: pip install deepspeed)")
        continue
    fi
    start=$(date +%s)
    # shellcheck disable=SC2086  # EXTRA_ARGS is deliberately word-split
    rm -rf "${BENCH_DIR:?}/$name"
    timeout "$BENCH_TIMEOUT" "$PYTHON" -m accelerate.commands.launch --config_file "$yaml" --num_processes "$NUM_GPUS" \
        --main_process_port 0 \
        recipes/rl_env.py --config "$RECIPE_CONFIG" \
        --max_steps "$STEPS" --logging_steps 1 --bf16 true --use_cpu false --beta 0.05 \
        --final_eval_episodes 4 --output_dir "$BENCH_DIR/$name" --report_to none --save_strategy no --seed 0 \
        $EXTRA_ARGS >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then  # the final model reloads and answers
        "$PYTHON" -c "import sys; from alea_trl import AleaModel; AleaModel.from_pretrained(sys.argv[1])" \
            "$BENCH_DIR/$name" >>"$log" 2>&1 || rc=3
    fi
    secs=$(($(date +%s) - start))
    last_loss=$(grep -o "'loss': '\?[-0-9.e+]*" "$log" | tail -n 1 | grep -o "[-0-9.e+]*$" || true)
    if [ "$rc" -eq 0 ]; then
        RESULT[$name]=ok
        SUMMARY+=("$name: ok (${NUM_GPUS} GPUs, ${STEPS} steps, ${secs}s, last loss ${last_loss:-n/a}, log $log)")
    else
        RESULT[$name]=fail
        why="exit code $rc"
        [ "$rc" -eq 124 ] && why="timed out after ${BENCH_TIMEOUT}s"
        [ "$rc" -eq 3 ] && why="the saved model did not reload"
        SUMMARY+=("$name: fail ($why after ${secs}s, log $log)")
        # the first error lines say more than torchrun's closing banner
        { grep -m 10 -E "Error|error:|Errno|Exception|Traceback|can.t " "$log" || tail -n 15 "$log"; } | sed "s/^/    [$name] /" >&2
    fi
done

for line in "${SUMMARY[@]}"; do
    echo "$line"
done

json="{"
status=0
sep=""
for name in "${NAMES[@]}"; do
    json+="${sep}\"$name\": \"${RESULT[$name]}\""
    sep=", "
    [ "${RESULT[$name]}" = ok ] || status=1
done
json+="}"
echo "$json"
[ -n "${OUT:-}" ] && echo "$json" >"$OUT/gpu_distributed.json" && cp "$BENCH_DIR"/*.log "$OUT/" 2>/dev/null
exit "$status"
