"""Migration 0018 on both databases: a delivery that 0017 gave up to an endpoint still marked
failing is held again (pending), to go once the endpoint is enabled, while one whose
endpoint was enabled since stays in the log as it ended; each model's alias moves so far
number its next event; and the downgrade refuses while delivery is paused (0017 could not
hold it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from core.db import Database, utcnow
from core.schema import alembic_config, upgrade
from core.webhooks.delivery_state import pause_delivery, resume_delivery
from tests.integration.conftest import database


def at_0017(db: Database) -> None:
    """Two endpoints with a delivery each that gave up, one endpoint failing still; a
    model whose alias moved twice: as the code of revision 0017 wrote them, in SQL."""
    now = utcnow()
    with db.writer() as s:
        for endpoint, failing in (("e-failing", now), ("e-enabled", None)):
            s.execute(
                text(
                    "INSERT INTO webhook_endpoints (id, owner, url, events, secret, enabled, "
                    "failing_since, created_at, updated_at) VALUES (:id, 'o', "
                    "'https://hooks.example/in', '[]', 'whsec_x', true, :failing, :at, :at)"
                ),
                {"id": endpoint, "failing": failing, "at": now},
            )
            s.execute(
                text(
                    "INSERT INTO webhook_events (id, owner, type, body, created_at) "
                    "VALUES (:id, 'o', 'webhook.test', '{}', :at)"
                ),
                {"id": f"evt_{endpoint}", "at": now},
            )
            s.execute(
                text(
                    "INSERT INTO webhook_deliveries (event_id, endpoint_id, status, attempts, "
                    "next_attempt_at, created_at) VALUES (:event, :id, 'failed', 9, :at, :at)"
                ),
                {"event": f"evt_{endpoint}", "id": endpoint, "at": now},
            )
        s.execute(
            text(
                "INSERT INTO models (id, owner, name, last_version, created_by, created_at) "
                "VALUES (7, 'o', 'digits', 0, 'o', :at)"
            ),
            {"at": now},
        )
        for to in (None, None):
            s.execute(
                text(
                    "INSERT INTO model_alias_moves (model_id, alias, from_version, to_version, "
                    "moved_by, moved_at) VALUES (7, 'production', NULL, :to, 'o', :at)"
                ),
                {"to": to, "at": now},
            )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0018_holds_what_0017_gave_up_and_refuses_to_downgrade_while_paused(
    kind: str, tmp_path: Path
) -> None:
    with database(kind, tmp_path) as url:
        command.upgrade(alembic_config(url), "0017")
        db = Database(url)
        try:
            at_0017(db)
            upgrade(url)
            with db.reader() as s:
                statuses = dict(
                    s.execute(text("SELECT endpoint_id, status FROM webhook_deliveries")).all()
                )
                moves = s.scalar(text("SELECT alias_sequence FROM models WHERE id = 7"))
            assert statuses == {"e-failing": "pending", "e-enabled": "failed"}
            assert moves == 2
            with db.writer() as s:
                pause_delivery(s, by="trainq restore")
            with pytest.raises(RuntimeError, match=r"webhook delivery is paused.*resume it"):
                command.downgrade(alembic_config(url), "0017")
            with db.writer() as s:
                resume_delivery(s)
            command.downgrade(alembic_config(url), "0017")  # not paused: it goes
            upgrade(url)
        finally:
            db.dispose()
