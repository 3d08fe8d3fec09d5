"""GET /metrics in Prometheus format: jobs, storage, the queue, workers, request latency,
event streams, and per-worker figures for admin keys. See docs/operations.md."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import CallerDep
from api.middleware import HTTPMiddleware
from api.routes.health import queue_depth, registered_workers
from core.db import Job
from core.queue import job_queue
from core.retention import stored_bytes
from core.spec import JobStatus
from core.webhooks.deliveries import Backlog, backlog
from core.worker_stats import read_worker_stats

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# Label values come only from these sets and the route templates: a request line is the
# client's to choose, and every new label value is a new series kept for the process's life.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"


class ServiceCollector(Collector):
    """Read at scrape time from the database and Redis, so every API process agrees."""

    def __init__(self, app: FastAPI, *, per_worker: bool) -> None:
        self.app = app
        self.per_worker = per_worker

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        state = self.app.state
        followers = state.events.open.total()
        yield GaugeMetricFamily(
            "trainq_sse_followers", "Event streams open in this API process.", value=followers
        )
        yield CounterMetricFamily(
            "trainq_sse_lagging",
            "Followers this API process let go as lagging (their connection left more than "
            "sse_max_lag live entries untaken).",
            value=state.events.lagging,
        )
        jobs = GaugeMetricFamily("trainq_jobs", "Jobs by status.", labels=["status"])
        r = state.redis
        q = job_queue(r, state.settings.queue)
        with state.db.reader() as s:
            counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
            held = stored_bytes(s)
            depth = queue_depth(q, s)
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status.value, 0))
        yield jobs
        stored = GaugeMetricFamily(
            "trainq_stored_bytes",
            "Bytes the database holds, by kind (step_rows: PostgreSQL's table size, or the "
            "row count times an estimate per row on SQLite).",
            labels=["kind"],
        )
        for kind, size in held.items():
            stored.add_metric([kind], size)
        yield stored
        with state.db.reader() as s:
            yield from _webhook_families(backlog(s))
        if depth is not None:  # None: the queue's key holds no list (api.routes.health)
            yield GaugeMetricFamily(
                "trainq_queue_depth", "Entries on the queue a worker will run.", value=depth
            )
        alive = len(registered_workers(q))
        yield GaugeMetricFamily("trainq_workers_alive", "Registered RQ workers.", value=alive)
        if self.per_worker:
            yield from self._worker_gauges(read_worker_stats(r))

    def _worker_gauges(self, stats: dict[str, dict[str, str]]) -> Iterator[GaugeMetricFamily]:
        specs = [
            ("images_per_second", "trainq_worker_images_per_second", "Training images/s."),
            ("step_seconds", "trainq_worker_step_seconds", "Seconds per training step."),
            ("memory_allocated", "trainq_worker_gpu_memory_allocated_bytes", "GPU memory."),
            ("memory_reserved", "trainq_worker_gpu_memory_reserved_bytes", "GPU memory."),
            ("memory_peak", "trainq_worker_gpu_memory_peak_bytes", "GPU memory peak."),
        ]
        for field, name, doc in specs:
            g = GaugeMetricFamily(name, doc, labels=["worker"])
            for worker, values in stats.items():
                value = _number(values.get(field))
                if value is not None:
                    g.add_metric([worker], value)
            yield g


def _webhook_families(b: Backlog) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """Webhook delivery (core.webhooks.deliveries.backlog), the same from every API process."""
    yield GaugeMetricFamily(
        "trainq_webhook_deliveries_pending",
        "Webhook deliveries not yet delivered, held ones among them.",
        value=b.pending,
    )
    yield GaugeMetricFamily(
        "trainq_webhook_deliveries_held",
        "Pending deliveries held: to an endpoint failing or disabled, or all while paused.",
        value=b.held,
    )
    yield GaugeMetricFamily(
        "trainq_webhook_oldest_pending_seconds",
        "Age of the oldest pending webhook delivery (0: none).",
        value=b.oldest_pending_s,
    )
    yield GaugeMetricFamily(
        "trainq_webhook_endpoints_failing",
        "Webhook endpoints marked failing: their events are held until they are enabled.",
        value=b.endpoints_failing,
    )
    yield GaugeMetricFamily(
        "trainq_webhook_delivery_paused",
        "1 while an operator has paused webhook delivery (every event held), else 0.",
        value=int(b.paused),
    )
    attempts = CounterMetricFamily(
        "trainq_webhook_attempts",
        "Webhook delivery attempts by outcome: delivered (2xx), rejected (another answer), "
        "no_answer, not_sent (address refused).",
        labels=["outcome"],
    )
    for outcome, n in b.attempts.items():
        attempts.add_metric([outcome.value], n)
    yield attempts


def _number(text: str | None) -> float | None:
    """A stats field as a float; anyone who can write to Redis can write junk there, and a
    junk value must cost its own series, not the whole scrape."""
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


async def record_route(request: Request) -> None:
    """An app-wide dependency: the matched route's template, for the latency label."""
    route = request.scope.get("route")
    request.state.route = getattr(route, "path", OTHER)


class TimeRequests(HTTPMiddleware):
    """Observes each HTTP request's latency, labelled by method, route template and status,
    each from a bounded set: an unknown method, and a request that matched no route or was
    refused before routing (no key), count as "other"."""

    def __init__(self, app: ASGIApp, latency: Histogram) -> None:
        super().__init__(app)
        self.latency = latency

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500  # if the app fails before it answers

        async def send_timed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        # The route dependency writes the template here (no ids in label values).
        scope.setdefault("state", {})["route"] = OTHER
        method = scope["method"] if scope["method"] in KNOWN_METHODS else OTHER
        try:
            await self.app(scope, receive, send_timed)
        finally:
            self.latency.labels(method, scope["state"]["route"], str(status)).observe(
                time.perf_counter() - start
            )


def install(app: FastAPI) -> None:
    latency = Histogram(
        "trainq_api_request_seconds",
        "API request latency.",
        ["method", "route", "status"],
        buckets=LATENCY_BUCKETS,
        registry=None,
    )
    # The same figures for every key, but the per-worker series only for admin keys.
    registries = {admin: CollectorRegistry() for admin in (False, True)}
    for admin, registry in registries.items():
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Several API processes behind one port (`trainq serve --workers N`): each writes
            # its latencies to a file there, and a scrape of any one adds up all of them.
            MultiProcessCollector(registry)
        else:
            registry.register(latency)
        registry.register(ServiceCollector(app, per_worker=admin))

    app.add_middleware(TimeRequests, latency=latency)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics",
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    def metrics(caller: CallerDep) -> Response:
        """Needs a key like every route but /health (Prometheus: `authorization` in the
        scrape config); the per-worker series need an admin key."""
        return Response(generate_latest(registries[caller.admin]), media_type=CONTENT_TYPE_LATEST)
