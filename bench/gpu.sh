#!/usr/bin/env bash
# The GPU checks, as one prepared script for a machine with a CUDA GPU (about 5 minutes).
# Each step prints JSON (or pytest's summary) and has its own time limit, so one that hangs
# cannot hide the others:
#   1. the trainer's unit tests on the GPU: with a GPU present every trainer test runs on
#      CUDA ("auto"), the CUDA-only ones included (fp16 without per-step syncs, compile, the
#      step buffer), and resume and export on CUDA;
#   2. bench.trainer on CUDA: the article's pipeline (fp16 GradScaler) against trainq's default;
#   3. bench.gpu: steady images/s at batch 64, 128, 512 and 4,096, bf16 against fp16, fused
#      against foreach optimizers, eager against torch.compile (CUDA graphs), peak memory, and
#      the streamed memory figures checked against torch.cuda.max_memory_allocated;
#   4. bench.claims on CUDA: the article's view/flatten and empty_cache claims.
# Usage: bench/gpu.sh [OUTDIR] [--quick]   (expects .venv from scripts/setup, or torch in python3)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-/tmp/trainq-gpu}}
mkdir -p "$OUTDIR"
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
"$PY" -c 'import json, torch; print(json.dumps({"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "torch": torch.__version__, "cuda": torch.version.cuda}))'
timeout 120 "$PY" -m pytest -q -p no:cacheprovider --junitxml="$OUTDIR/unit.xml" \
  tests/unit/test_trainer.py tests/unit/test_step_buffer.py tests/unit/test_resume.py \
  tests/unit/test_export.py tests/unit/test_preemption.py 2>&1 | tee "$OUTDIR/unit.log" | tail -15
timeout 100 "$PY" -m bench.trainer --device cuda --epochs 2 | tee "$OUTDIR/trainer.json"
timeout 240 "$PY" -m bench.gpu --epochs 2 | tee "$OUTDIR/gpu.json"
[ "${2:-}" = "--quick" ] || timeout 60 "$PY" -m bench.claims --device cuda | tee "$OUTDIR/claims.json"
