"""Per-owner quotas: the limits a key works within, and what it uses of them.

The defaults come from Settings (`TRAINQ_QUOTA_*`); an admin overrides any of them for one
owner (a row in `quotas`, through PUT /quotas/{owner}). A limit of None means no limit.
Admins (owner None) have none. The API refuses what would pass a limit with 429 and a body
that names it (`QuotaExceeded`); the workers' fair share never starts more of an owner's
jobs at once than `max_running`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from core.config import Settings
from core.db import Quota

LIMIT_NAMES = ("max_queued", "max_running", "max_dataset_bytes", "max_train_hours_per_day")


class Limits(BaseModel):
    """One owner's limits, each None for no limit."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    max_queued: int | None = Field(None, ge=0)
    max_running: int | None = Field(None, ge=1)
    max_dataset_bytes: int | None = Field(None, ge=0)
    max_train_hours_per_day: float | None = Field(None, gt=0)


UNLIMITED = Limits()


def default_limits(settings: Settings) -> Limits:
    return Limits(
        max_queued=settings.quota_max_queued,
        max_running=settings.quota_max_running,
        max_dataset_bytes=settings.quota_max_dataset_bytes,
        max_train_hours_per_day=settings.quota_max_train_hours_per_day,
    )


def limits_for(s: Session, settings: Settings, owner: str | None) -> Limits:
    """The owner's limits: its overrides over the defaults; none at all for admins."""
    if owner is None:
        return UNLIMITED
    row = s.get(Quota, owner)
    base = default_limits(settings)
    if row is None:
        return base
    return base.model_copy(update=_known(row.limits))


def overrides(s: Session) -> dict[str, Limits]:
    """Every owner's overridden limits (only the fields set)."""
    return {row.owner: Limits.model_validate(_known(row.limits)) for row in s.query(Quota)}


def _known(raw: Any) -> dict[str, Any]:
    return {k: v for k, v in (raw or {}).items() if k in LIMIT_NAMES}
