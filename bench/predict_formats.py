"""Which model format answers one predict request fastest on this CPU.

Trains one short job on mnist-sample (a real model in every format, each verified as a job
is), then, per format: the time to load it from its bytes, and the latency of one request
of 1 and of 64 held-out digits (p50 and p99 over `--calls` calls after a warm-up), as
`POST /jobs/{id}/predict` runs it (api.inference: inference mode, torch's threads for
TorchScript and pt2, api.inference.ONNX_THREADS for onnxruntime). The ratios are against
TorchScript measured in the same run. TorchScript loads with torch.jit.load, pt2 with
torch.export.load(...).module(), ONNX with an onnxruntime CPU session.

Prints one JSON object.    python -m bench.predict_formats [--calls 500]
(OMP_NUM_THREADS=1 puts torch on one thread, as onnxruntime is.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from api.inference import ONNX_THREADS
from core.spec import ExportFormat, JobSpec
from core.train import train
from core.train.data import load_dataset, write_mnist_sample
from core.train.verify_export import Model, load_model


def cpu_name() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    fields = {}
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first CPU's
    flags = set(fields.get("flags", "").split())
    name = fields.get("model name", "")
    return {
        "model_name": name or "unknown",
        "avx512_bf16": "avx512_bf16" in flags,
        "avx2": "avx2" in flags,
        "torch_threads": torch.get_num_threads(),
        "onnxruntime_threads": ONNX_THREADS,
    }


def latencies(model: Model, x: torch.Tensor, calls: int) -> dict[str, float]:
    """p50 and p99 of one call, in milliseconds, after a warm-up."""
    times = []
    with torch.inference_mode():
        for _ in range(max(10, calls // 10)):
            model(x)
        for _ in range(calls):
            t0 = time.perf_counter()
            model(x).softmax(1)
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "p50_ms": 1000 * statistics.median(times),
        "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))],
    }


def measure(fmt: ExportFormat, blob: bytes, x: torch.Tensor, calls: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = load_model(fmt, blob, threads=ONNX_THREADS)
    loaded = time.perf_counter() - t0
    return {
        "size_bytes": len(blob),
        "load_s": loaded,
        "batch1": latencies(model, x[:1], calls),
        "batch64": latencies(model, x[:64], calls),
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    base = results[ExportFormat.torchscript]
    out = {}
    for fmt, r in results.items():
        out[fmt] = {
            "load": r["load_s"] / base["load_s"],
            **{
                f"{batch}_{q}": r[batch][q] / base[batch][q]
                for batch in ("batch1", "batch64")
                for q in ("p50_ms", "p99_ms")
            },
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        write_mnist_sample(data_dir / "mnist-sample" / "MNIST" / "raw")
        result = train(JobSpec(epochs=1), data_dir=data_dir)
        x = load_dataset("mnist-sample", data_dir).test.images[:64].float().div(255)
    results = {fmt: measure(fmt, m.data, x, args.calls) for fmt, m in result.models.items()}
    print(
        json.dumps(
            {
                "cpu": cpu_name(),
                "torch": torch.__version__,
                "calls": args.calls,
                "export_s": result.record["export_s"],
                "formats": results,
                "ratio_to_torchscript": ratios(results),
                "fastest_batch1_p50": min(results, key=lambda f: results[f]["batch1"]["p50_ms"]),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
