"""The reconciler as the worker launcher runs it: one pass at a time, never fatal."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from core.config import Settings
from core.db import Database
from core.reconcile import reconcile_once
from core.redis_server import connect

log = logging.getLogger("trainq.reconcile")


class Reconciler:
    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.db: Database | None = None

    def __call__(self) -> None:
        # Created lazily, and only in the launcher: its children fork from a clean process.
        if self.db is None:
            self.db = Database.from_settings(self.settings)
        r = connect(self.redis_url)
        try:
            report = reconcile_once(self.db, r, self.settings)
            if report.requeued or report.failed or report.reenqueued:
                log.warning("reconciled: %s", report)
        except (RedisError, SQLAlchemyError, OSError) as e:
            log.warning("reconcile pass skipped: %s", e)
        except Exception:  # never the launcher's end: its workers would be orphaned
            log.exception("reconcile pass failed; the next one tries again")
        finally:
            r.close()
