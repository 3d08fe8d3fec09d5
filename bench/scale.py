"""The scale model, measured: how many GPU workers one Redis and one PostgreSQL carry.

N simulated GPU workers publish step blocks into one redis-server through the worker's own
writer (core.stream.Publisher, as worker.recorder drives it): each `--rate` steps/s (an H200
at about 1,000), flushed every `--flush-ms` (100 ms), and at every epoch end (60,000 images
at the default batch size) the epoch's database write (core.store.save_epoch: the step rows
in bulk, the epoch row and a checkpoint of the default model's size) on PostgreSQL, plus a
heartbeat per worker every 5 s. Meanwhile SSE followers (GET /jobs/{id}/events) and pollers
(GET /jobs/{id}/metrics, following the live tail) read through a real API process (uvicorn,
real HTTP). N grows (1, 2, 4, ...) until a point misses its targets: stream entries/s
achieved against offered, Redis CPU (INFO cpu deltas), the API's /metrics p50/p99, SSE
delivery lag (a step's time to its receipt) and database rows/s.

The publishers, the observer (followers and pollers), the API, Redis and PostgreSQL share
this machine's cores, so a knee may be the simulation's own: each point reports who used
the CPU, and Redis's CPU per stream entry gives its ceiling on a core of its own.

    python -m bench.scale [--quick] [--sweep 1,2,4,8] [--seconds 6]

Prints one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import platform
import queue
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import text, update

from bench.loadgen import encode_request
from core.config import Settings
from core.db import Database, Job
from core.owners import owner_id
from core.redis_client import connect
from core.schema import upgrade
from core.spec import JobSpec, JobStatus
from core.store import claim_job, create_job, heartbeat, save_epoch
from core.stream import Publisher, epoch_entry, job_keys, status_entry, step_entries
from core.train import EpochMetrics, StepMetrics
from tests.service import RedisServer, Service, postgres_database
from worker.attempt import job_row

HEARTBEAT_S = 5.0  # worker.recorder's heartbeat: min(5 s, heartbeat timeout / 3)
WARMUP_S = 1.0
TRAIN_IMAGES = 60_000
KEY = "key-scale"
# A point misses when it delivers less than this share of the offered entries, or when a
# follower or poller waits longer than these (a dashboard's patience, not a hard target).
DELIVERED_SHARE = 0.95
SSE_LAG_P99_S = 1.0
METRICS_P99_S = 0.25


@dataclass(frozen=True)
class Load:
    """What one simulated GPU worker does."""

    rate: int  # steps/s
    flush_s: float  # one step block (one Redis round trip) every flush_s
    steps_per_epoch: int
    checkpoint_bytes: int
    seconds: float  # measured, after WARMUP_S


# --- the publishers: N simulated GPU workers over a few processes -----------------------


@dataclass
class SimWorker:
    job_id: str
    stream: Publisher
    step: int = 0
    due: float = 0.0
    unsaved: int = 0


def publish(job_ids: list[str], db_url: str, redis_url: str, load: Load, out: Any, go: Any) -> None:
    """One publisher process: its workers' step blocks in one thread (as many workers as it
    has, each due every flush_s), their epoch writes and heartbeats in another, as a worker's
    trainer and its database writes would be on their own hosts."""
    r = connect(redis_url)
    db = Database(db_url, pooled=True)
    maxlen = Settings().metrics_maxlen
    sims = [
        SimWorker(j, Publisher(r, j, 1, maxlen, row=lambda j=j: job_row(db, j))) for j in job_ids
    ]
    writes: queue.Queue[Callable[[], None] | None] = queue.Queue()
    db_stats = _DbStats()
    writer = threading.Thread(target=_db_writer, args=(writes, db_stats), daemon=True)
    writer.start()
    blob = os.urandom(load.checkpoint_bytes)
    out.put("ready")
    go.wait()  # the jobs are claimed now: their attempts start, as a worker's do
    for sim in sims:
        sim.stream.add([status_entry(0, {"status": JobStatus.running.value})])
        sim.stream.flush()
    t0 = time.monotonic()
    measure_from, end = t0 + WARMUP_S, t0 + WARMUP_S + load.seconds
    per_block = max(1, round(load.rate * load.flush_s))
    for i, sim in enumerate(sims):  # spread over the first period, as real workers are
        sim.due = t0 + load.flush_s * i / len(sims)
    next_beat = t0 + HEARTBEAT_S
    entries, late, flush_s = 0, [], []
    cpu0 = time.process_time()
    while (now := time.monotonic()) < end:
        sim = min(sims, key=lambda s: s.due)
        if sim.due > now:
            time.sleep(sim.due - now)
            continue
        counted = now >= measure_from
        if counted:
            late.append(now - sim.due)
        t = time.perf_counter()
        written = _block(sim, per_block, load, blob, db, writes, db_stats, counted)
        if counted:
            flush_s.append(time.perf_counter() - t)
            entries += written
        sim.due += load.flush_s
        if now >= next_beat:
            for s in sims:
                writes.put(lambda j=s.job_id: _beat(db, j, db_stats))
            next_beat += HEARTBEAT_S
    cpu = time.process_time() - cpu0
    db_stats.waiting = writes.qsize()
    writes.put(None)
    writer.join(timeout=60)
    out.put(
        {
            "entries": entries,
            "late_s": late,
            "flush_s": flush_s,
            "cpu_s": cpu,
            "wall_s": time.monotonic() - t0,
            "stopped": [s.stream.stopped.value for s in sims if s.stream.stopped],
            **db_stats.summary(),
        }
    )
    db.dispose()


def _block(
    sim: SimWorker,
    n: int,
    load: Load,
    blob: bytes,
    db: Database,
    writes: queue.Queue[Callable[[], None] | None],
    db_stats: _DbStats,
    counted: bool,
) -> int:
    """One step block, as Recorder.on_steps sends it, and where it crosses an epoch's end,
    that epoch's entry and (in the writer thread) its database write. The stream entries
    Redis took."""
    now = time.time()
    points = [_point(sim.step + k + 1, load, now) for k in range(n)]
    sim.step += n
    sim.stream.add(step_entries(points))
    written = len(sim.stream.waiting)
    boundary = sim.step // load.steps_per_epoch * load.steps_per_epoch
    if boundary > sim.step - n and boundary > 0:
        epoch = _epoch(boundary, load)
        steps = [
            _point(s, load, now) for s in range(boundary - load.steps_per_epoch + 1, boundary + 1)
        ]
        sim.stream.add([epoch_entry(epoch)])
        writes.put(lambda: _save(db, sim.job_id, epoch, steps, blob, db_stats, counted))
        written += 1
    if not sim.stream.flush():
        return 0
    return written


def _point(step: int, load: Load, now: float) -> StepMetrics:
    epoch = (step - 1) // load.steps_per_epoch + 1
    return StepMetrics(
        step, epoch, 0.1 + 1 / step, 1e-3, 64.0 * load.rate, 1 << 28, 1 << 29, 1 << 29, now
    )


def _epoch(step: int, load: Load) -> EpochMetrics:
    return EpochMetrics(
        step // load.steps_per_epoch, step, 0.1, 0.97, 0.1, 0.98, 1.0, 64.0 * load.rate
    )


class _DbStats:
    def __init__(self) -> None:
        self.epoch_s: list[float] = []
        self.rows = 0
        self.heartbeats = 0
        self.waiting = 0  # writes queued when the run ended: the database fell behind
        self.errors: list[str] = []

    def summary(self) -> dict[str, Any]:
        return {
            "epoch_write_s": self.epoch_s,
            "db_rows": self.rows,
            "heartbeats": self.heartbeats,
            "db_waiting": self.waiting,
            "db_errors": self.errors[:3],
        }


def _db_writer(writes: queue.Queue[Callable[[], None] | None], stats: _DbStats) -> None:
    while (write := writes.get()) is not None:
        try:
            write()
        except Exception as e:  # reported, not raised: one failed write must not end the run
            stats.errors.append(repr(e)[:200])


def _save(
    db: Database,
    job_id: str,
    epoch: EpochMetrics,
    steps: list[StepMetrics],
    blob: bytes,
    stats: _DbStats,
    counted: bool,
) -> None:
    t = time.perf_counter()
    with db.writer() as s:
        save_epoch(s, job_id=job_id, attempt=1, epoch=epoch, steps=steps, checkpoint=blob)
    if counted:
        stats.epoch_s.append(time.perf_counter() - t)
        stats.rows += len(steps) + 1


def _beat(db: Database, job_id: str, stats: _DbStats) -> None:
    with db.writer() as s:
        heartbeat(s, job_id=job_id, attempt=1)
    stats.heartbeats += 1


# --- the observer: SSE followers and /metrics pollers, over real HTTP ---------------------


def observe(
    url: str,
    key: str,
    job_ids: list[str],
    followers: int,
    pollers: int,
    poll_s: float,
    seconds: float,
    out: Any,
    go: Any,
) -> None:
    """One process of followers and pollers, each on a job of its own (round robin)."""
    out.put("ready")
    go.wait()
    result = asyncio.run(_observe(url, key, job_ids, followers, pollers, poll_s, seconds))
    out.put(result)


async def _observe(
    url: str,
    key: str,
    job_ids: list[str],
    followers: int,
    pollers: int,
    poll_s: float,
    seconds: float,
) -> dict[str, Any]:
    host = urlsplit(url)
    measure_from = time.monotonic() + WARMUP_S
    end = measure_from + seconds
    lags: list[float] = []
    latencies: list[float] = []
    errors: list[str] = []
    cpu0 = time.process_time()

    async def follow(job_id: str) -> None:
        reader, writer = await asyncio.open_connection(host.hostname, host.port)
        writer.write(encode_request("GET", host.netloc, f"/jobs/{job_id}/events", key, None))
        await reader.readuntil(b"\r\n\r\n")
        try:
            while time.monotonic() < end:
                data = await asyncio.wait_for(reader.read(1 << 16), end - time.monotonic())
                if not data:
                    errors.append(f"events of {job_id} closed")
                    return
                # The newest step in the chunk: its time is when its block left the trainer.
                i = data.rfind(b'"time": ')
                if i >= 0 and time.monotonic() >= measure_from:
                    j = data.find(b"}", i)
                    if j > 0:
                        lags.append(time.time() - float(data[i + 8 : j]))
        except TimeoutError:
            return
        finally:
            writer.close()

    async def poll(job_id: str) -> None:
        reader, writer = await asyncio.open_connection(host.hostname, host.port)
        after = 0
        try:
            while time.monotonic() < end:
                path = f"/jobs/{job_id}/metrics?after={after}&limit=1000"
                t = time.perf_counter()
                writer.write(encode_request("GET", host.netloc, path, key, None))
                status, body = await _response(reader)
                if time.monotonic() >= measure_from:
                    latencies.append(time.perf_counter() - t)
                if status != 200:
                    errors.append(f"/metrics {status}")
                else:
                    i = body.rfind(b'"next": ')
                    after = int(body[i + 8 : body.index(b",", i)])
                await asyncio.sleep(poll_s)
        finally:
            writer.close()

    tasks = [follow(job_ids[i % len(job_ids)]) for i in range(followers)]
    tasks += [poll(job_ids[i % len(job_ids)]) for i in range(pollers)]
    await asyncio.gather(*tasks)
    return {
        "lags_s": lags,
        "metrics_s": latencies,
        "errors": errors[:5],
        "cpu_s": time.process_time() - cpu0,
    }


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    i = lower.index(b"content-length:")
    length = int(lower[i + 15 : lower.index(b"\r\n", i)])
    return int(head[9:12]), await reader.readexactly(length)


# --- one point of the sweep -----------------------------------------------------------


def _jobs(db: Database, n: int) -> list[str]:
    """n queued jobs of the bench's key."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    with db.writer() as s:
        for job_id in ids:
            create_job(s, job_id=job_id, spec=JobSpec(), owner=owner_id(KEY))
    return ids


def _claim(db: Database, jobs: list[str]) -> None:
    """Each job claimed as a worker would: attempt 1 running, its heartbeat fresh."""
    with db.writer() as s:
        for job_id in jobs:
            claim_job(s, job_id=job_id, worker=f"sim-{job_id[:8]}", device="sim")


def point(
    svc: Service, db: Database, n: int, load: Load, args: argparse.Namespace
) -> dict[str, Any]:
    jobs = _jobs(db, n)
    r = svc.redis.client()
    procs = max(1, min(args.publishers, n))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()  # set once every process has imported and connected
    children = [
        ctx.Process(
            target=publish,
            args=(jobs[i::procs], svc.database_url, svc.redis.url, load, out, go),
        )
        for i in range(procs)
    ]
    children.append(
        ctx.Process(
            target=observe,
            args=(
                svc.url,
                KEY,
                jobs,
                args.followers,
                args.pollers,
                args.poll_s,
                load.seconds,
                out,
                go,
            ),
        )
    )
    for c in children:
        c.start()
    for _ in children:
        assert out.get(timeout=300) == "ready"
    _claim(db, jobs)
    go.set()
    time.sleep(WARMUP_S)
    cpu0, api0, pg0, t0 = _redis_cpu(r), _proc_cpu(svc), _pg_cpu(db), time.monotonic()
    time.sleep(load.seconds)
    cpu1, api1, pg1 = _redis_cpu(r), _proc_cpu(svc), _pg_cpu(db)
    wall = time.monotonic() - t0
    pg = sum(v - pg0.get(pid, v) for pid, v in pg1.items())  # backends alive throughout
    memory = int(r.info("memory")["used_memory"])
    results = [out.get(timeout=120) for _ in children]
    for c in children:
        c.join(timeout=30)
    pubs = [x for x in results if "entries" in x]
    obs = next(x for x in results if "lags_s" in x)
    for job_id in jobs:
        r.delete(*job_keys(job_id))
    with db.writer() as s:  # ended, so that the API's reconciler leaves them alone
        s.execute(update(Job).where(Job.id.in_(jobs)).values(status=JobStatus.canceled))
    cpu = {"redis": (cpu1 - cpu0) / wall, "api": (api1 - api0) / wall, "postgres": pg / wall}
    return _summary(n, load, pubs, obs, cpu, memory)


def _summary(
    n: int,
    load: Load,
    pubs: list[dict[str, Any]],
    obs: dict[str, Any],
    cpu: dict[str, float],
    redis_memory: int,
) -> dict[str, Any]:
    offered = n * load.rate
    achieved = sum(p["entries"] for p in pubs) / load.seconds
    late = [x for p in pubs for x in p["late_s"]]
    epoch_s = [x for p in pubs for x in p["epoch_write_s"]]
    lag, metrics = obs["lags_s"], obs["metrics_s"]
    row = {
        "workers": n,
        "offered_steps_per_s": offered,
        "stream_entries_per_s": round(achieved),
        "delivered_share": round(achieved / offered, 3),
        "redis_cpu_cores": round(cpu["redis"], 3),
        "redis_us_per_entry": round(cpu["redis"] / achieved * 1e6, 2) if achieved else None,
        "redis_used_memory_mb": round(redis_memory / 2**20, 1),
        "block_round_trip_ms": _quantiles(
            [x for p in pubs for x in p["flush_s"]], 1000, (0.5, 0.99)
        ),
        "block_late_ms": _quantiles(late, 1000, (0.5, 0.99)),
        "publisher_cpu_cores": round(sum(p["cpu_s"] for p in pubs) / load.seconds, 3),
        "api_cpu_cores": round(cpu["api"], 3),
        "postgres_cpu_cores": round(cpu["postgres"], 3),
        "observer_cpu_cores": round(obs["cpu_s"] / load.seconds, 3),
        "metrics_ms": _quantiles(metrics, 1000, (0.5, 0.99)),
        "metrics_requests": len(metrics),
        "sse_lag_ms": _quantiles(lag, 1000, (0.5, 0.99)),
        "db_rows_per_s": round(sum(p["db_rows"] for p in pubs) / load.seconds),
        "epoch_writes": len(epoch_s),
        "epoch_write_ms": _quantiles(epoch_s, 1000, (0.5, 0.99)),
        # The worker writes its epoch before it trains on (worker.recorder): this share of
        # an epoch's time its GPU would wait.
        "epoch_write_share": round(statistics.median(epoch_s) * load.rate / load.steps_per_epoch, 3)
        if epoch_s
        else None,
        "epoch_writes_waiting": sum(p["db_waiting"] for p in pubs),
        "heartbeats": sum(p["heartbeats"] for p in pubs),
        "errors": [e for p in pubs for e in p["db_errors"]] + obs["errors"],
        "stopped_streams": [s for p in pubs for s in p["stopped"]],
    }
    row["misses"] = _misses(row)
    row["slow"] = _slow(row)
    return row


def _misses(row: dict[str, Any]) -> list[str]:
    """What the point failed to carry: the knee is the first point with any."""
    misses = []
    if row["delivered_share"] < DELIVERED_SHARE:
        misses.append(f"delivered {row['delivered_share']:.0%} of the offered entries")
    if row["epoch_writes_waiting"] > row["workers"]:
        misses.append(f"{row['epoch_writes_waiting']} epoch writes behind")
    if row["errors"] or row["stopped_streams"]:
        misses.append("errors")
    return misses


def _slow(row: dict[str, Any]) -> list[str]:
    """The readers' latencies past their targets (on shared cores, often the machine's)."""
    slow = []
    sse = row["sse_lag_ms"].get("p99")
    if sse is None or sse > SSE_LAG_P99_S * 1000:
        slow.append(f"SSE lag p99 {sse} ms")
    metrics = row["metrics_ms"].get("p99")
    if metrics is None or metrics > METRICS_P99_S * 1000:
        slow.append(f"/metrics p99 {metrics} ms")
    return slow


def _quantiles(xs: list[float], scale: float, qs: tuple[float, ...]) -> dict[str, float]:
    if not xs:
        return {}
    xs = sorted(xs)
    return {
        f"p{round(q * 100)}": round(xs[min(len(xs) - 1, int(q * len(xs)))] * scale, 2) for q in qs
    }


def _pg_cpu(db: Database) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving the bench's database (the server runs
    on this machine)."""
    with db.reader() as s:
        pids = s.scalars(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ).all()
    return {pid: cpu for pid in pids if (cpu := _cpu_of(pid)) is not None}


def _cpu_of(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu(r: Any) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _proc_cpu(svc: Service) -> float:
    """The API's CPU seconds: its process and every process it started (uvicorn's)."""
    assert svc.api is not None
    from tests.service import descendants

    return sum(_cpu_of(pid) or 0.0 for pid in [svc.api.pid, *descendants(svc.api.pid)])


# --- the run ------------------------------------------------------------------------------


def checkpoint_bytes() -> int:
    """A checkpoint of the default spec's model on MNIST, as large as the trainer's: the
    weights, AdamW's two moments and the weights' moving average, in float32."""
    from core.train.model import Net

    spec = JobSpec()
    net = Net(
        conv1=spec.conv1_channels,
        conv2=spec.conv2_channels,
        hidden=spec.hidden,
        conv3=spec.conv3_channels,
    )
    return 4 * 4 * sum(p.numel() for p in net.parameters())


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "note": "Redis, PostgreSQL, the API, the publishers and the observer share these "
        "cores with other work: figures are noisy, and a knee may be the machine's, "
        "not Redis's (see each point's CPU columns)",
    }


@contextmanager
def service(folder: Path) -> Iterator[tuple[Service, Database]]:
    """A redis-server as deployed (AOF, fsync every second), a fresh PostgreSQL database at
    head (dropped afterwards) and the API under uvicorn, with no workers."""
    redis = RedisServer(folder / "redis", appendfsync="everysec")
    redis.start()
    databases = postgres_database()
    url = next(databases)
    try:
        upgrade(url)
        (folder / "data").mkdir()
        svc = Service(
            data_dir=folder / "data", database_url=url, redis=redis, keys=(KEY, "key-other")
        )
        svc.start_api()
        db = Database(url, pooled=True)
        try:
            yield svc, db
        finally:
            db.dispose()
            svc.stop()
    finally:
        redis.kill()
        next(databases, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 s a point, up to 64 workers")
    p.add_argument("--sweep", default="1,2,4,8,16,32,64,128")
    p.add_argument("--seconds", type=float, default=8.0, help="measured per point")
    p.add_argument("--rate", type=int, default=1000, help="steps/s per worker")
    p.add_argument("--flush-ms", type=float, default=100.0)
    p.add_argument("--followers", type=int, default=8)
    p.add_argument("--pollers", type=int, default=8)
    p.add_argument("--poll-s", type=float, default=1.0)
    p.add_argument("--publishers", type=int, default=2, help="publisher processes")
    p.add_argument("--past-knee", type=int, default=1, help="points measured past the knee")
    args = p.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 3.0)
        args.sweep = ",".join(x for x in args.sweep.split(",") if int(x) <= 64)
    spec = JobSpec()
    load = Load(
        rate=args.rate,
        flush_s=args.flush_ms / 1000,
        steps_per_epoch=math.ceil(TRAIN_IMAGES / spec.batch_size),
        checkpoint_bytes=checkpoint_bytes(),
        seconds=args.seconds,
    )
    points: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="trainq-scale-") as tmp,
        service(Path(tmp)) as (svc, db),
    ):
        past = 0
        for n in (int(x) for x in args.sweep.split(",")):
            points.append(point(svc, db, n, load, args))
            if points[-1]["misses"]:
                past += 1
                if past > args.past_knee:
                    break
    print(json.dumps(_report(args, load, points), indent=2))


def _report(args: argparse.Namespace, load: Load, points: list[dict[str, Any]]) -> dict[str, Any]:
    carried = [pt for pt in points if not pt["misses"]]
    knee = next((pt for pt in points if pt["misses"]), None)
    return {
        "benchmark": "scale",
        "machine": machine(),
        "load_per_worker": {
            "steps_per_s": load.rate,
            "block_every_ms": load.flush_s * 1000,
            "steps_per_epoch": load.steps_per_epoch,
            "checkpoint_bytes": load.checkpoint_bytes,
            "heartbeat_every_s": HEARTBEAT_S,
        },
        "followers": args.followers,
        "pollers": args.pollers,
        "poll_every_s": args.poll_s,
        "seconds_per_point": load.seconds,
        "targets": {
            "delivered_share": DELIVERED_SHARE,
            "sse_lag_p99_ms": SSE_LAG_P99_S * 1000,
            "metrics_p99_ms": METRICS_P99_S * 1000,
        },
        "points": points,
        "most_workers_carried": carried[-1]["workers"] if carried else 0,
        "knee": {"workers": knee["workers"], "misses": knee["misses"]} if knee else None,
        "per_core": _per_core(load, points),
    }


def _per_core(load: Load, points: list[dict[str, Any]]) -> dict[str, Any]:
    """Each shared part's cost per unit of work, from every point that carried its load
    (medians), and the workers at this rate that one core of it would carry."""
    carried = [pt for pt in points if not pt["misses"]] or points
    redis_us = [pt["redis_us_per_entry"] for pt in carried if pt["redis_us_per_entry"]]
    pg_ms = [
        pt["postgres_cpu_cores"] * load.seconds / pt["epoch_writes"] * 1000
        for pt in carried
        if pt["epoch_writes"]
    ]
    epochs_per_s = load.rate / load.steps_per_epoch  # per worker
    out: dict[str, Any] = {}
    if redis_us:
        us = statistics.median(redis_us)
        out["redis_us_per_entry"] = round(us, 2)
        out["redis_workers_per_core"] = round(1e6 / us / load.rate)
    if pg_ms:
        ms = statistics.median(pg_ms)
        out["postgres_cpu_ms_per_epoch_write"] = round(ms, 1)
        out["postgres_workers_per_core"] = round(1000 / ms / epochs_per_s)
    return out


if __name__ == "__main__":
    main()
