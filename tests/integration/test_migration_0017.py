"""Migration 0017's downgrade on both databases: the schema before it has no webhooks, so
dropping them would lose the endpoints keys registered (their URLs and the secrets their
receivers verify with) and every event not yet delivered. It refuses, naming them, as 0015
and 0016 refuse to lose what people made; with none left, it goes."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import delete, func, select

from core.db import Database, WebhookDelivery, WebhookEndpoint
from core.schema import alembic_config, upgrade
from core.webhooks.endpoints import create_endpoint
from core.webhooks.outbox import TEST_EVENT, record_event
from tests.integration.conftest import database


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_0017_refuses_to_downgrade_over_registered_webhooks(kind: str, tmp_path: Path) -> None:
    with database(kind, tmp_path) as url:
        upgrade(url)
        db = Database(url)
        try:
            with db.writer() as s:
                hook = create_endpoint(
                    s, owner="o", url="https://hooks.example/in", events=[], description=None
                )
                record_event(s, owner="o", type=TEST_EVENT, data={}, endpoint_id=hook.id)
            with pytest.raises(RuntimeError, match=f"1 webhook endpoint.*{hook.id}.*1 event"):
                command.downgrade(alembic_config(url), "0016")
            with db.reader() as s:
                assert s.scalar(select(func.count()).select_from(WebhookDelivery)) == 1
            with db.writer() as s:
                s.execute(delete(WebhookEndpoint))
            command.downgrade(alembic_config(url), "0016")  # nothing registered: it goes
            upgrade(url)
        finally:
            db.dispose()
