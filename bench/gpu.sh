#!/usr/bin/env bash
# The GPU checks, as one prepared script for a machine with a CUDA GPU (under 5 minutes).
# Prints JSON lines: the CUDA-only tests' outcome, the article-vs-trainq trainer benchmark
# on CUDA (fp16 GradScaler baseline against trainq's default), trainq with torch.compile
# (CUDA graphs), and the article's claims (view/flatten, empty_cache) measured on the GPU.
# Usage: bench/gpu.sh   (expects .venv from scripts/setup, or torch in the python3 on PATH)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
"$PY" - <<'PYEOF'
import json, torch
print(json.dumps({"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "torch": torch.__version__, "cuda": torch.version.cuda}))
PYEOF
"$PY" -m pytest -q -p no:cacheprovider tests/unit/test_trainer.py -k "cuda or fp16 or compile" 2>&1 | tail -3
timeout 150 "$PY" -m bench.trainer --device cuda --epochs 2
timeout 90 "$PY" - <<'PYEOF'
import json, tempfile, pathlib
from bench.trainer import build_bench_data, run_trainq
import torch
with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp) / "b"
    build_bench_data(root, pathlib.Path(tmp) / "s")
    dev = torch.device("cuda")
    out = {name: run_trainq(root, 2, dev, **kw) for name, kw in {
        "default_bs64": {}, "bs128": {"batch_size": 128}, "bs512": {"batch_size": 512},
        "compile_bs128": {"compile": True, "batch_size": 128},
    }.items()}
    print(json.dumps({"benchmark": "trainq_variants_cuda", "results": out}))
PYEOF
timeout 60 "$PY" -m bench.claims --device cuda
