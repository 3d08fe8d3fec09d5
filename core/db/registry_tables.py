"""The tables of the model registry (core.store.registry): named models of one owner, their
numbered versions (each one succeeded job's model with its lineage), the aliases that point
at one version each, every move of an alias, and read-only shares. See docs/registry.md."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from core.db.clock import utcnow
from core.db.tables import Base


class Model(Base):
    """A named model of one owner (core.store.registry): numbered versions, each one
    succeeded job's model, and aliases that point at one version each."""

    __tablename__ = "models"
    __table_args__ = (
        UniqueConstraint("owner", "name", name="uq_models_owner_name"),
        Index("ix_models_name", "name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(64))
    # The last version number given: the next is this plus one, taken under the row's lock;
    # a deleted version's number is never given again.
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    # The number of the model's last alias move, any alias's: the next is this plus one,
    # taken under the row's lock, in the move's transaction (model.alias_moved's `sequence`).
    alias_sequence: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    """One version of a model: one succeeded job's model, with its lineage copied at
    registration. The key to the job has no cascade: a registered job cannot be deleted."""

    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "job_id", name="uq_model_versions_model_job"),
        # What the retention pass and DELETE /jobs/{id} ask: is this job registered?
        Index("ix_model_versions_job", "job_id"),
    )

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id"))
    spec: Mapped[dict[str, Any]]
    dataset: Mapped[str] = mapped_column(String(200))
    dataset_sha256: Mapped[str | None] = mapped_column(String(64))
    metrics: Mapped[dict[str, Any] | None]
    classes: Mapped[list[str] | None] = mapped_column(JSON)
    formats: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{format, sha256, size}]
    registered_by: Mapped[str] = mapped_column(String(64))
    registered_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ModelAlias(Base):
    """Where an alias of a model points now; moved only by core.store.registry.move_alias."""

    __tablename__ = "model_aliases"
    __table_args__ = (
        ForeignKeyConstraint(
            ["model_id", "version"],
            ["model_versions.model_id", "model_versions.version"],
            name="fk_model_aliases_version",
        ),
    )

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    moved_by: Mapped[str] = mapped_column(String(64))
    moved_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class AliasMove(Base):
    """Each move of an alias, in the order they applied: from one version (None: it was
    new) to another (None: removed), by whom and when."""

    __tablename__ = "model_alias_moves"
    __table_args__ = (Index("ix_model_alias_moves_alias", "model_id", "alias", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    alias: Mapped[str] = mapped_column(String(64))
    from_version: Mapped[int | None]
    to_version: Mapped[int | None]
    moved_by: Mapped[str] = mapped_column(String(64))
    moved_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ModelShare(Base):
    """A model an admin shared read-only with another owner: it may download and predict
    with it, never register, move an alias or delete."""

    __tablename__ = "model_shares"
    __table_args__ = (Index("ix_model_shares_reader", "reader"),)

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    reader: Mapped[str] = mapped_column(String(64), primary_key=True)
    shared_by: Mapped[str] = mapped_column(String(64))
    shared_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
