"""webhook delivery that loses nothing and can be watched: delivery's one row of state (paused
by an operator, the dispatchers' last pass), attempts counted by outcome, each delivery's
`trying_since` (the day of retries counts from its first attempt), each model's
`alias_sequence` (model.alias_moved's `sequence`), and the deliveries that gave up to an
endpoint still marked failing held again, to go once it is enabled

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-20 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Plain ALTER TABLE ADD COLUMN on both databases, as 0012 and 0016: no batch copy of a table.


def upgrade() -> None:
    op.create_table(
        "webhook_delivery_state",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("paused_by", sa.String(length=64), nullable=True),
        sa.Column("paused_reason", sa.Text(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name="ck_webhook_delivery_state_one_row"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute("INSERT INTO webhook_delivery_state (id) VALUES (1)")
    op.create_table(
        "webhook_attempt_counts",
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("outcome"),
    )
    op.add_column(
        "webhook_deliveries",
        sa.Column("trying_since", sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column(
        "models",
        sa.Column("alias_sequence", sa.Integer(), server_default="0", nullable=False),
    )
    # A model's moves so far are its sequence so far: the next event's number follows them.
    op.execute(
        "UPDATE models SET alias_sequence = "
        "(SELECT count(*) FROM model_alias_moves WHERE model_alias_moves.model_id = models.id)"
    )
    # 0017 gave a delivery up after a day and marked its endpoint failing: held now, it goes
    # when the endpoint is enabled again, as every later event to it will.
    op.execute(
        "UPDATE webhook_deliveries SET status = 'pending', claim = NULL WHERE status = 'failed' "
        "AND endpoint_id IN (SELECT id FROM webhook_endpoints WHERE failing_since IS NOT NULL)"
    )


def downgrade() -> None:
    # Below this revision nothing can pause delivery: a paused database (a restored copy
    # among them) would start sending the moment it is downgraded. Refuse, saying so.
    bind = op.get_bind()
    paused = bind.execute(
        sa.text("SELECT paused_at FROM webhook_delivery_state WHERE paused_at IS NOT NULL")
    ).first()
    if paused is not None:
        raise RuntimeError(
            f"cannot downgrade below 0018: webhook delivery is paused (since {paused[0]}), "
            "and 0017 cannot hold it: resume it first (`trainq webhook resume`), or stay"
        )
    op.drop_column("models", "alias_sequence")
    op.drop_column("webhook_deliveries", "trying_since")
    op.drop_table("webhook_attempt_counts")
    op.drop_table("webhook_delivery_state")
