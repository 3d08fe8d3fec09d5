"""`trainq migrate`, `serve`, `worker`, `up`: running the service."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from cli.main import command
from core.config import Settings
from core.local.keys import load_or_create_key

log = logging.getLogger("trainq.reconcile")


def _no_options(_: argparse.ArgumentParser) -> None:
    pass


def _with_keys(settings: Settings) -> Settings:
    """No keys configured: make (once) and use the local key file, so no route is open."""
    if settings.api_key_list or settings.admin_key_list:
        return settings
    key = load_or_create_key(settings.key_file)
    return settings.model_copy(update={"api_keys": key})


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


def _check_schema(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    from core.db import make_engine
    from core.local.migrate import alembic_config

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    if current != head:
        return f"the database is at revision {current}, not {head}: run `trainq migrate` first"
    return None


@command("migrate", "Create or upgrade the database schema (Alembic, to head).", _no_options)
def migrate_command(_: argparse.Namespace) -> int:
    from core.local.migrate import upgrade

    settings = Settings()
    upgrade(settings.resolved_database_url)
    print(
        f"trainq: database at head ({_safe_url(settings.resolved_database_url)})", file=sys.stderr
    )
    return 0


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="default TRAINQ_HOST (127.0.0.1)")
    p.add_argument("--port", type=int, help="default TRAINQ_PORT (8000)")


@command("serve", "Run the HTTP API (uvicorn).", _serve_options)
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
    problem = _check_schema(settings.resolved_database_url)
    if problem:
        print(f"trainq: {problem}", file=sys.stderr)
        return 2
    return _serve(_with_keys(settings))


def _serve(settings: Settings) -> int:
    import uvicorn

    from api.app import create_app
    from core.local.redis_server import redis_url

    url = redis_url(settings)
    app = create_app(settings, url)
    _reconcile_in_background(settings, url)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", access_log=False)
    return 0


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


def _worker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default="all", help="all, cpu, or GPU indices such as 0,1")
    p.add_argument("--burst", action="store_true", help="exit once the queue is empty")


@command("worker", "Run one RQ worker per GPU (or one on the CPU).", _worker_options)
def worker_command(args: argparse.Namespace) -> int:
    from core.local.redis_server import redis_url
    from worker.launcher import parse_gpus, run_workers
    from worker.reconciler import Reconciler

    settings = Settings()
    url = redis_url(settings)
    # Only a bad --gpus is the caller's error (exit 2); a ValueError from a running launcher
    # is a fault, and must not end it quietly as if the arguments were wrong.
    try:
        gpus = parse_gpus(args.gpus)
    except ValueError as e:
        print(f"trainq: {e}", file=sys.stderr)
        return 2
    return run_workers(
        ",".join(g for g in gpus if g is not None) or "cpu",  # as parsed: no second probe
        settings.queue,
        url,
        burst=args.burst,
        reconcile=Reconciler(settings, url),
        reconcile_every_s=settings.reconcile_interval_s,
    )


def _up_options(p: argparse.ArgumentParser) -> None:
    _serve_options(p)
    _worker_options(p)


@command("up", "Everything on one machine: Redis, migrated DB, API, workers.", _up_options)
def up_command(args: argparse.Namespace) -> int:
    from core.local.migrate import upgrade
    from core.local.redis_server import start_embedded, stop_embedded

    settings = Settings()
    if args.host:
        settings = settings.model_copy(update={"host": args.host})
    if args.port is not None:
        settings = settings.model_copy(update={"port": args.port})
    upgrade(settings.resolved_database_url)
    started_redis = False
    url = settings.redis_url
    if not url:
        url, started_redis = start_embedded(settings.data_dir)
    settings = _with_keys(settings.model_copy(update={"redis_url": url}))
    env = {**os.environ, "TRAINQ_REDIS_URL": url, "TRAINQ_DATA_DIR": str(settings.data_dir)}
    env["TRAINQ_DATABASE_URL"] = settings.resolved_database_url
    cmd = [sys.executable, "-m", "cli", "worker", "--gpus", args.gpus]
    workers = subprocess.Popen(cmd + (["--burst"] if args.burst else []), env=env)
    print(
        f"trainq up: API http://{settings.host}:{settings.port} (docs at /docs), "
        f"redis {url}, database {_safe_url(settings.resolved_database_url)}",
        file=sys.stderr,
    )
    if not (Settings().api_key_list or Settings().admin_key_list):
        key = settings.api_key_list[0]
        print(f"trainq up: API key {key} (kept in {settings.key_file})", file=sys.stderr)
    try:
        return _serve(settings)
    finally:
        workers.send_signal(signal.SIGTERM)
        try:
            workers.wait(timeout=30)
        except subprocess.TimeoutExpired:
            workers.kill()
        if started_redis:
            time.sleep(0.1)
            stop_embedded(settings.data_dir)
