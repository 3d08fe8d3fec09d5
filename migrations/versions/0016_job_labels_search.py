"""jobs and sweeps: name, tags and notes; job_tags; what GET /jobs searches and sorts by (the
spec's data set and architecture, the final figures) copied onto the job's row, with their
indexes

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-10 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As core.db.tables has them at this revision.
FINAL_COLUMNS = (
    "final_test_accuracy",
    "final_test_loss",
    "final_train_accuracy",
    "final_train_loss",
    "final_images_per_second",
    "final_duration_s",
)
FROM_RESULT = {  # the result's figure each final column copies (train accuracy: the last epoch's)
    "final_test_accuracy": "test_accuracy",
    "final_test_loss": "test_loss",
    "final_train_loss": "train_loss",
    "final_images_per_second": "images_per_second",
    "final_duration_s": "duration_s",
}
SEARCH_TEXT = sa.String(128).with_variant(sa.String(128, collation="C"), "postgresql")
CREATED = ("created_at", "id")
INDEXES = {
    "ix_jobs_owner_created": ("owner", *CREATED),
    "ix_jobs_owner_status_created": ("owner", "status", *CREATED),
    "ix_jobs_owner_dataset_created": ("owner", "dataset", *CREATED),
    "ix_jobs_owner_model_created": ("owner", "model", *CREATED),
    "ix_jobs_owner_name": ("owner", "name_key"),
}

# Plain ALTER TABLE on both databases, as 0012: no batch copy of the table (on SQLite a copy
# of jobs would cascade-delete its children).


def upgrade() -> None:
    for name, kind in [
        ("name", sa.String(128)),
        ("name_key", SEARCH_TEXT),
        ("notes", sa.Text()),
        ("tags", sa.JSON()),
        ("dataset", sa.String(64)),
        ("model", sa.String(32)),
        *[(column, sa.Float()) for column in FINAL_COLUMNS],
    ]:
        op.add_column("jobs", sa.Column(name, kind, nullable=True))
    for name, kind in [("name", sa.String(128)), ("notes", sa.Text()), ("tags", sa.JSON())]:
        op.add_column("sweeps", sa.Column(name, kind, nullable=True))
    op.create_table(
        "job_tags",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "tag"),
    )
    op.create_index(
        "ix_job_tags_tag_owner_created", "job_tags", ["tag", "owner", "created_at", "job_id"]
    )
    _copy_searched_fields()
    # (owner, status) is the start of (owner, status, created_at, id), which serves it.
    op.drop_index("ix_jobs_owner_status", table_name="jobs")
    for name, columns in INDEXES.items():
        op.create_index(name, "jobs", list(columns))
    for column in FINAL_COLUMNS:
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            f"ix_jobs_owner_{column}",
            "jobs",
            ["owner", column, "id"],
            sqlite_where=where,
            postgresql_where=where,
        )


def _copy_searched_fields() -> None:
    """Each stored job's data set and architecture from its spec (a spec stored before
    `model` existed trained the cnn; a raw spec that is no object has neither), and each
    succeeded job's final figures from its result and last epoch."""
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        is_object = "json_typeof(spec) = 'object'"
        text_of = "CASE WHEN json_typeof(spec->'{k}') = 'string' THEN left(spec->>'{k}', {n}) END"
        absent = "spec->'model' IS NULL"
        figure = "CASE WHEN json_typeof(result->'{k}') = 'number' THEN (result->>'{k}')::float END"
    else:
        # Python's json writes a non-finite float as `Infinity`, which SQLite's JSON
        # functions refuse: such a spec or result is passed over, not read.
        is_object = "CASE WHEN json_valid(spec) THEN json_type(spec) END = 'object'"
        text_of = (
            "CASE WHEN json_type(spec, '$.{k}') = 'text' "
            "THEN substr(json_extract(spec, '$.{k}'), 1, {n}) END"
        )
        absent = "json_type(spec, '$.model') IS NULL"
        figure = (
            "CASE WHEN json_type(result, '$.{k}') IN ('real', 'integer') "
            "THEN json_extract(result, '$.{k}') END"
        )
    dataset, model = text_of.format(k="dataset", n=64), text_of.format(k="model", n=32)
    op.execute(
        f"UPDATE jobs SET dataset = CASE WHEN {is_object} THEN {dataset} END, "
        f"model = CASE WHEN {is_object} THEN COALESCE({model}, "
        f"CASE WHEN {absent} THEN 'cnn' END) END"
    )
    figures = ", ".join(f"{column} = {figure.format(k=k)}" for column, k in FROM_RESULT.items())
    last_epoch = (
        "(SELECT e.train_accuracy FROM epoch_metrics e WHERE e.job_id = jobs.id "
        "ORDER BY e.epoch DESC LIMIT 1)"
    )
    readable = "" if postgres else " AND json_valid(result)"
    op.execute(
        f"UPDATE jobs SET {figures}, final_train_accuracy = {last_epoch} "
        f"WHERE status = 'succeeded' AND result IS NOT NULL{readable}"
    )


def downgrade() -> None:
    # The schema before this one keeps no names, tags or notes: dropping them would lose
    # what people wrote. Refuse, naming them.
    bind = op.get_bind()
    labelled = [
        row[0]
        for table in ("jobs", "sweeps")
        for row in bind.execute(
            sa.text(
                f"SELECT id FROM {table} WHERE name IS NOT NULL OR notes IS NOT NULL "
                "OR (tags IS NOT NULL AND CAST(tags AS TEXT) NOT IN ('[]', 'null'))"
            )
        )
    ]
    if labelled:
        shown = ", ".join(labelled[:10]) + (", ..." if len(labelled) > 10 else "")
        raise RuntimeError(
            f"cannot downgrade below 0015: {len(labelled)} job(s) or sweep(s) have a name, "
            f"tags or notes that would be lost ({shown}); stay on this version, or remove "
            "them first (PATCH each with name, notes null and tags [])"
        )
    for column in reversed(FINAL_COLUMNS):
        op.drop_index(f"ix_jobs_owner_{column}", table_name="jobs")
    for name in reversed(INDEXES):
        op.drop_index(name, table_name="jobs")
    op.create_index("ix_jobs_owner_status", "jobs", ["owner", "status"])
    op.drop_index("ix_job_tags_tag_owner_created", table_name="job_tags")
    op.drop_table("job_tags")
    for name in ("tags", "notes", "name"):
        op.drop_column("sweeps", name)
    for name in [
        *reversed(FINAL_COLUMNS),
        "model",
        "dataset",
        "tags",
        "notes",
        "name_key",
        "name",
    ]:
        op.drop_column("jobs", name)
