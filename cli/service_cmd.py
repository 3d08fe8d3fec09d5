"""`trainq migrate`, `serve`, `worker`, `up`: running the service. See docs/operations.md."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cli.local.keys import load_or_create_key
from cli.supervisor import Supervisor, start
from core.config import Settings

log = logging.getLogger("trainq.reconcile")


def _with_keys(settings: Settings) -> Settings:
    """No keys configured: make (once) and use the local key file, so no route is open. That
    key is the installation's admin: on a laptop it must see every job, those enqueued
    straight onto the queue without an owner too."""
    if settings.api_key_list or settings.admin_key_list:
        return settings
    key = load_or_create_key(settings.key_file)
    return settings.model_copy(update={"admin_keys": key})


def _safe_url(url: str) -> str:
    """A database URL fit for a log: the password masked."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _not_at_head(url: str) -> bool:
    """Whether the database is not at the migrations' head (said on stderr): the API and the
    workers refuse to start on it rather than fail every query."""
    from core.schema import schema_problem

    problem = schema_problem(url)
    if problem is not None:
        print(f"trainq: {problem}", file=sys.stderr)
    return problem is not None


def migrate_command(_: argparse.Namespace) -> int:
    from core.schema import upgrade

    settings = Settings()
    upgrade(settings.resolved_database_url)
    print(
        f"trainq: database at head ({_safe_url(settings.resolved_database_url)})", file=sys.stderr
    )
    return 0


def serve_command(args: argparse.Namespace) -> int:
    settings = Settings()
    if args.host:
        settings = settings.model_copy(update={"host": args.host})
    if args.port is not None:
        settings = settings.model_copy(update={"port": args.port})
    if not (settings.api_key_list or settings.admin_key_list) and not _is_loopback(settings.host):
        print(
            f"trainq: refusing to serve on {settings.host} with no API keys configured; "
            "set TRAINQ_API_KEYS (or bind to 127.0.0.1)",
            file=sys.stderr,
        )
        return 2
    if _not_at_head(settings.resolved_database_url):
        return 2
    return _serve(_with_keys(settings), args.workers)


def _serve(settings: Settings, workers: int = 1) -> int:
    """The API, in `workers` processes behind one port, and one reconciler and one webhook
    dispatcher beside them."""
    import uvicorn

    from cli.local.redis_server import redis_url

    url = redis_url(settings)
    _reconcile_in_background(settings, url)
    _deliver_webhooks_in_background(settings)
    host, port = settings.host, settings.port
    if workers == 1:
        from api.app import create_app

        app = create_app(settings, url)
        uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
        return 0
    with api_processes(settings, url):
        # Each process builds its app from the environment (api.app.from_environment).
        uvicorn.run(
            "api.app:from_environment",
            factory=True,
            workers=workers,
            host=host,
            port=port,
            log_level="info",
            access_log=False,
        )
    return 0


@contextlib.contextmanager
def api_processes(settings: Settings, redis_url: str) -> Iterator[None]:
    """What every API process must share, handed down in the environment they are started
    with: the settings this command resolved (the Redis it may have started, the key it may
    have made), and an empty folder for Prometheus's multiprocess mode, so that /metrics
    from any process counts the requests of all (api.observability). The folder is this
    port's, emptied at every start: a server killed before it could remove it leaves one
    folder, never one a run. It is in memory (/dev/shm) where the host has it: Prometheus
    maps its files, and a page the full data disk cannot back kills the process (SIGBUS)."""
    folder = _metrics_root(settings) / f"trainq-api-metrics-{os.getuid()}-{settings.port}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ.update(
        TRAINQ_REDIS_URL=redis_url,
        TRAINQ_API_KEYS=settings.api_keys,
        TRAINQ_ADMIN_KEYS=settings.admin_keys,
        PROMETHEUS_MULTIPROC_DIR=str(folder),
    )
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _metrics_root(settings: Settings) -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else settings.data_dir


def _reconcile_in_background(settings: Settings, redis_url: str) -> None:
    """The API reconciles as every worker launcher does: with every worker gone, a job whose
    worker died is still ended or requeued within the heartbeat timeout. Any number of
    reconcilers may run (each transition is a guarded update)."""
    from worker.reconciler import Reconciler

    reconcile = Reconciler(settings, redis_url)

    def loop() -> None:
        while True:
            time.sleep(settings.reconcile_interval_s)
            try:
                reconcile()
            except Exception:  # a bug in one pass must not end the API's reconciling
                log.exception("reconcile pass failed")

    threading.Thread(target=loop, name="trainq-reconcile", daemon=True).start()


def _deliver_webhooks_in_background(settings: Settings) -> None:
    """Every `trainq serve` delivers webhooks from the outbox (`trainq up` and the compose
    file's api service run one): any number of dispatchers may run, each claim a guarded
    update, so more API replicas are more dispatchers, and none is a single point."""
    from core.webhooks.dispatcher import start_in_thread

    start_in_thread(settings)


def worker_command(args: argparse.Namespace) -> int:
    from cli.local.redis_server import redis_url
    from core.schema import schema_problem
    from worker.launcher import parse_gpus, run_workers
    from worker.reconciler import Reconciler

    settings = Settings()
    # Only a bad --gpus is the caller's error (exit 2); a ValueError from a running launcher
    # is a fault, and must not end it quietly as if the arguments were wrong.
    try:
        gpus = parse_gpus(args.gpus)
    except ValueError as e:
        print(f"trainq: {e}", file=sys.stderr)
        return 2
    if _not_at_head(settings.resolved_database_url):
        return 2
    url = redis_url(settings)
    return run_workers(
        ",".join(g for g in gpus if g is not None) or "cpu",  # as parsed: no second probe
        settings.queue,
        url,
        burst=args.burst,
        reconcile=Reconciler(settings, url),
        reconcile_every_s=settings.reconcile_interval_s,
        schema_problem=lambda: schema_problem(settings.resolved_database_url),
    )


def up_command(args: argparse.Namespace) -> int:
    """Everything on one machine, as children of this process (cli.supervisor): the embedded
    Redis (unless TRAINQ_REDIS_URL names one), the API and the worker launcher."""
    from cli.local.data_dir_lock import DataDirInUse, hold_data_dir
    from core.schema import upgrade

    settings = Settings()
    if args.host:
        settings = settings.model_copy(update={"host": args.host})
    if args.port is not None:
        settings = settings.model_copy(update={"port": args.port})
    try:
        hold_data_dir(settings.data_dir)  # until this process ends
    except DataDirInUse as e:
        print(f"trainq up: {e}", file=sys.stderr)
        return 1
    upgrade(settings.resolved_database_url)
    supervisor = Supervisor()
    supervisor.handle_signals()  # from here on a signal stops whatever has started
    try:
        return _up(args, settings, supervisor)
    finally:
        supervisor.stop()


def _up(args: argparse.Namespace, settings: Settings, supervisor: Supervisor) -> int:
    from cli.local.redis_server import (
        prepare_folder,
        server_command,
        stop_leftover,
        wait_for_embedded,
    )

    env = {**os.environ, "TRAINQ_DATA_DIR": str(settings.data_dir)}
    url = settings.redis_url
    if not url:
        stop_leftover(settings.data_dir)
        prepare_folder(settings.data_dir)
        redis = start("embedded Redis", server_command(settings.data_dir, daemonize=False), env)
        supervisor.last.append(redis)
        url = wait_for_embedded(settings.data_dir, server=redis.proc)
    settings = _with_keys(settings.model_copy(update={"redis_url": url}))
    env.update(
        TRAINQ_REDIS_URL=url,
        TRAINQ_DATABASE_URL=settings.resolved_database_url,
        TRAINQ_API_KEYS=settings.api_keys,
        TRAINQ_ADMIN_KEYS=settings.admin_keys,
    )
    trainq = [sys.executable, "-m", "cli"]
    api = [*trainq, "serve", "--host", settings.host, "--port", str(settings.port)]
    supervisor.first.append(start("API", [*api, "--workers", str(args.workers)], env))
    launcher = [*trainq, "worker", "--gpus", args.gpus] + (["--burst"] if args.burst else [])
    supervisor.first.append(start("worker launcher", launcher, env, may_end=args.burst))
    print(
        f"trainq up: API http://{settings.host}:{settings.port} (docs at /docs), "
        f"redis {url}, database {_safe_url(settings.resolved_database_url)}",
        file=sys.stderr,
    )
    if not (Settings().api_key_list or Settings().admin_key_list):
        key = settings.admin_key_list[0]
        print(f"trainq up: admin API key {key} (kept in {settings.key_file})", file=sys.stderr)
    return supervisor.wait()
