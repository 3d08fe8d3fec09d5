"""/usage and /quotas: what each key may use (core.quotas) and uses; admins see every
owner's and set any one's limits. See docs/quotas.md."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import AdminDep, AdminOwnersDep, CallerDep, ReaderDep, SessionDep, SettingsDep
from api.responses import NO_KEY, NOT_ADMIN
from api.schemas import OwnerUsage, QuotaList, QuotaOut, UsageReport
from core.config import Settings
from core.quotas import (
    UNLIMITED,
    Limits,
    Usage,
    clear_overrides,
    every_usage,
    in_force,
    override_of,
    overrides,
    set_overrides,
    usage,
)
from core.text import PLAIN_PATTERN

router = APIRouter(tags=["quotas"])
ERRORS = NO_KEY
ADMIN_ERRORS = {**NO_KEY, **NOT_ADMIN}
Owner = Annotated[
    str, Path(min_length=1, max_length=64, pattern=PLAIN_PATTERN, description="An owner id, k_...")
]


@router.get(
    "/usage",
    response_model=UsageReport,
    responses=ERRORS,
    summary="The key's limits and what it uses of them",
    description="Jobs queued and running, bytes of uploaded data sets, and hours of "
    "training in the trailing 24 h (every attempt, of deleted jobs too; running ones up "
    "to now), with the limits in force (null: no limit). An admin key also gets every "
    "owner's.",
)
def get_usage(
    session: ReaderDep, caller: CallerDep, settings: SettingsDep, admins: AdminOwnersDep
) -> UsageReport:
    if not caller.admin:
        override = override_of(session, caller.owner)
        found = usage(session, caller.owner)
        return UsageReport(caller=_line(settings, caller.owner, found, override, False), owners=[])
    set_by_admin = overrides(session)
    lines = {
        owner: _line(settings, owner, found, set_by_admin.get(owner or ""), owner in admins)
        for owner, found in every_usage(session).items()
    }
    mine = lines.get(caller.owner) or _line(settings, caller.owner, Usage(), None, True)
    return UsageReport(caller=mine, owners=sorted(lines.values(), key=lambda o: o.owner or ""))


def _line(
    settings: Settings, owner: str | None, found: Usage, override: Limits | None, admin: bool
) -> OwnerUsage:
    """An owner's line of an admin's report: admins, and the jobs enqueued without an owner
    (theirs), have no limits."""
    limits = UNLIMITED if admin or owner is None else in_force(settings, override)
    overridden = sorted(override.model_fields_set) if override is not None else []
    return OwnerUsage(owner=owner, limits=limits, overridden=overridden, usage=found)


@router.get("/quotas", response_model=QuotaList, responses=ADMIN_ERRORS, summary="Every override")
def get_quotas(session: ReaderDep, _: AdminDep, settings: SettingsDep) -> QuotaList:
    quotas = [_quota_out(settings, owner, o) for owner, o in sorted(overrides(session).items())]
    return QuotaList(defaults=in_force(settings, None), quotas=quotas)


@router.put(
    "/quotas/{owner}",
    response_model=QuotaOut,
    responses={**ADMIN_ERRORS, 422: {"description": "Not a limit, or out of its range."}},
    summary="Set an owner's limits",
    description="The body's fields replace the owner's overrides: a number sets a limit, "
    "null means no limit, a field left out takes the default. In force at once, for the "
    "next request.",
)
def put_quota(
    owner: Owner, limits: Limits, session: SessionDep, _: AdminDep, settings: SettingsDep
) -> QuotaOut:
    set_overrides(session, owner, limits)
    session.commit()
    return _quota_out(settings, owner, limits)


@router.delete(
    "/quotas/{owner}",
    response_model=QuotaOut,
    responses=ADMIN_ERRORS,
    summary="An owner back to the defaults",
)
def delete_quota(owner: Owner, session: SessionDep, _: AdminDep, settings: SettingsDep) -> QuotaOut:
    clear_overrides(session, owner)
    session.commit()
    return _quota_out(settings, owner, None)


def _quota_out(settings: Settings, owner: str, override: Limits | None) -> QuotaOut:
    set_values = override.model_dump(exclude_unset=True) if override is not None else {}
    return QuotaOut(owner=owner, overrides=set_values, limits=in_force(settings, override))
