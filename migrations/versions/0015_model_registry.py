"""the model registry: named models, their numbered versions (each one succeeded job's
model, with its lineage), aliases, each alias's moves, and read-only shares

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-10 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner", "name", name="uq_models_owner_name"),
    )
    op.create_index("ix_models_name", "models", ["name"])
    op.create_table(
        "model_versions",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("dataset", sa.String(length=200), nullable=False),
        sa.Column("dataset_sha256", sa.String(length=64), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("classes", sa.JSON(), nullable=True),
        sa.Column("formats", sa.JSON(), nullable=False),
        sa.Column("registered_by", sa.String(length=64), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        # No cascade: the database itself refuses to delete a registered job.
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("model_id", "version"),
        sa.UniqueConstraint("model_id", "job_id", name="uq_model_versions_model_job"),
    )
    op.create_index("ix_model_versions_job", "model_versions", ["job_id"])
    op.create_table(
        "model_aliases",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("moved_by", sa.String(length=64), nullable=False),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        # An alias points at a version that exists: deleting it is refused while it does.
        sa.ForeignKeyConstraint(
            ["model_id", "version"],
            ["model_versions.model_id", "model_versions.version"],
            name="fk_model_aliases_version",
        ),
        sa.PrimaryKeyConstraint("model_id", "name"),
    )
    op.create_table(
        "model_alias_moves",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=True),
        sa.Column("moved_by", sa.String(length=64), nullable=False),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_model_alias_moves_alias", "model_alias_moves", ["model_id", "alias", "id"])
    op.create_table(
        "model_shares",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("reader", sa.String(length=64), nullable=False),
        sa.Column("shared_by", sa.String(length=64), nullable=False),
        sa.Column("shared_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("model_id", "reader"),
    )
    op.create_index("ix_model_shares_reader", "model_shares", ["reader"])


def downgrade() -> None:
    # The schema before this one has no registry: dropping it would forget every model,
    # version and alias, and let the retention policy purge the models they kept. Refuse,
    # naming them.
    bind = op.get_bind()
    models = [
        f"{row[0]} ({row[1]})" for row in bind.execute(sa.text("SELECT name, owner FROM models"))
    ]
    if models:
        shown = ", ".join(models[:10]) + (", ..." if len(models) > 10 else "")
        raise RuntimeError(
            f"cannot downgrade below 0015: {len(models)} registered model(s) would be lost "
            f"({shown}); stay on this version, or delete them first "
            "(DELETE /models/{name}/versions/{n}, then DELETE /models/{name})"
        )
    op.drop_index("ix_model_shares_reader", table_name="model_shares")
    op.drop_table("model_shares")
    op.drop_index("ix_model_alias_moves_alias", table_name="model_alias_moves")
    op.drop_table("model_alias_moves")
    op.drop_table("model_aliases")
    op.drop_index("ix_model_versions_job", table_name="model_versions")
    op.drop_table("model_versions")
    op.drop_index("ix_models_name", table_name="models")
    op.drop_table("models")
