"""A trained model in hand: the export and check of its formats, and a 1-epoch job from
submit to succeeded.

1. In one process, on one trained model (the seed's CNN on mnist-sample, the three default
   formats), rounds interleaved:
   - `before`: the way trainq did it before the worker's checker: a new Python process
     started as the exports begin (its imports overlapping them), the three formats
     exported one after another with torch.onnx.export's own call, and checked together
     once all are made;
   - `own_checker`: a checker started for this export alone (what `trainq train` does);
   - `shared_checker`: the checker a worker starts once and shares with its jobs (warmed,
     a child forked per check, each format checked while the next exports).
2. Through the service (a redis-server, SQLite, the API under uvicorn, one worker): 1-epoch
   mnist-sample jobs one after another on an idle worker, submit -> succeeded, and its parts
   from the job's row and its run record (queue, data, setup, training, export; the rest is
   the claim, the writes and the poll).

Prints one JSON object.    python -m bench.export_check [--rounds 5] [--jobs 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from core.spec import ExportFormat, JobSpec
from core.train import checker, export, verify_export
from core.train.data import Dataset, load_dataset, write_mnist_sample
from core.train.model_card import model_metadata
from core.train.run import Run
from tests.service import Service, scratch_service, wait_until

FORMATS = list(ExportFormat)
# The check as it was: every format in one fresh process, what to check on its stdin.
BEFORE_CHECK = """
import json, runpy, sys
import torch, onnxruntime, torch._export.serde.serialize
v = runpy.run_path(sys.argv[1])
x, expected, blobs, meta, _ = v["decode"](sys.stdin.buffer)
print(json.dumps(v["check_all"](x, expected, blobs, meta)))
"""


def before(net: torch.nn.Module, data: Dataset) -> float:
    started = time.perf_counter()
    wrapped = export._portable(net, data)
    x = data.test.images[:256].float().div(255)
    meta = model_metadata(data)
    with torch.inference_mode():
        expected = wrapped(x)
    proc = subprocess.Popen(
        [sys.executable, "-P", "-c", BEFORE_CHECK, str(checker.VERIFIER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    program = export._exported_program(wrapped, x)
    onnx = torch.onnx.export(program, (x,), dynamo=True, verbose=False)
    assert onnx is not None
    proto = onnx.model_proto  # made anew at each read
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    blobs = {
        "torchscript": export._torchscript(wrapped, x, meta),
        "pt2": export._pt2(program, meta),
        "onnx": proto.SerializeToString(),
    }
    out, _ = proc.communicate(verify_export.encode(x, expected, blobs, meta))
    report = json.loads(out)
    assert all("max_abs_diff" in report[f] for f in blobs), report
    return time.perf_counter() - started


def timed_export(net: torch.nn.Module, data: Dataset) -> tuple[float, dict[str, Any]]:
    exports = export.export_models(net, data, FORMATS)
    assert list(exports.models) == FORMATS, exports.report
    return exports.seconds, exports.report


def in_process(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        write_mnist_sample(Path(tmp) / "mnist-sample" / "MNIST" / "raw")
        data = load_dataset("mnist-sample", Path(tmp))
    # The default spec's model as the trainer builds it: what an export costs is the same
    # for any weights.
    spec = JobSpec(epochs=1)
    net = Run(spec, torch.device("cpu"), None, data, lambda: None, data.normalization).eval_model
    times: dict[str, list[float]] = {"before": [], "own_checker": [], "shared_checker": []}
    reports = []
    before(net, data)  # the first export in a process pays its imports: not counted
    for _ in range(rounds):
        times["before"].append(before(net, data))
        times["own_checker"].append(timed_export(net, data)[0])
    checker.share()
    export.warm_up()
    for _ in range(rounds):
        seconds, report = timed_export(net, data)
        times["shared_checker"].append(seconds)
        reports.append(report)
    base = statistics.median(times["before"])
    return {
        "rounds": rounds,
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "speedup_vs_before": {
            k: round(base / statistics.median(v), 2) for k, v in times.items() if k != "before"
        },
        "shared_checker_last_report": {
            f: {k: v for k, v in entry.items() if k.endswith("_s")}
            for f, entry in reports[-1].items()
        },
    }


def _ts(value: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(value)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def through_the_service(svc: Service, jobs: int) -> dict[str, Any]:
    c = svc.client()
    spec = {"epochs": 1}
    first = c.submit(spec)["id"]  # the worker's first job: not counted
    wait_until(lambda: c.job(first)["status"] == "succeeded", 300, "the first job", 0.05)
    rows = []
    for _ in range(jobs):
        t0 = time.perf_counter()
        job = c.submit(spec)["id"]
        wait_until(lambda j=job: c.job(j)["status"] == "succeeded", 300, "the job", 0.01)
        total = time.perf_counter() - t0
        done = c.job(job)
        timings = c.record(job)["timings"]
        queue = (_ts(done["started_at"]) - _ts(done["created_at"])).total_seconds()
        rows.append({"submit_to_succeeded_s": total, "queue_s": queue, **timings})
    keys = rows[0].keys()
    median = {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}
    median["rest_s"] = round(
        median["submit_to_succeeded_s"]
        - sum(median[k] for k in ("queue_s", "data_s", "setup_s", "train_s", "export_s")),
        3,
    )
    median["beyond_training_s"] = round(median["submit_to_succeeded_s"] - median["train_s"], 3)
    return {"jobs": jobs, "spec": spec, "median": median}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=5)
    args = p.parse_args()
    with scratch_service(workers=1) as svc:
        service = through_the_service(svc, args.jobs)
    local = in_process(args.rounds)
    print(
        json.dumps(
            {
                "benchmark": "export_check",
                "cpu": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                "in_process": local,
                "service": service,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
