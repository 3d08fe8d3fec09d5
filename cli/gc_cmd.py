"""`trainq gc`: the retention policy's purge (core.retention), run to the end or reported,
and on SQLite the space it freed given back to the disk (core.db.sqlite.reclaim_space).
See docs/jobs.md ("Retention and deletion") and docs/operations.md ("Reclaiming disk")."""

from __future__ import annotations

import argparse
import sys

from core.config import Settings
from core.db import Database
from core.db.sqlite import FileSpace, reclaim_space
from core.retention import KINDS, Footprint, collect, kept_registered, plan


def gc_command(args: argparse.Namespace) -> int:
    settings = Settings()
    days = args.older_than_days if args.older_than_days is not None else settings.retention_days
    if days is None or days <= 0:
        print(
            "trainq gc: say how old an ended job must be: --older-than-days N (N > 0), or set "
            "TRAINQ_RETENTION_DAYS",
            file=sys.stderr,
        )
        return 2
    db = Database.from_settings(settings)
    try:
        space = None
        if args.dry_run:
            footprint = plan(db, older_than_days=days)
        else:
            footprint = collect(db, older_than_days=days, batch=settings.retention_batch)
        kept = kept_registered(db, older_than_days=days)
        if not args.dry_run and db.engine.dialect.name == "sqlite":
            space = reclaim_space(db.engine, full=args.vacuum)
    finally:
        db.dispose()
    print(report(footprint, days, dry_run=args.dry_run))
    if kept:
        print(f"kept {kept} jobs as old whose models are registered versions (docs/registry.md)")
    if space is not None:
        print(disk_report(space))
    return 0


def disk_report(space: FileSpace) -> str:
    """What the disk got back, measured on the file and its log, not counted from rows."""
    lines = [
        f"database file and log: {space.before} bytes before, {space.after} after "
        f"({space.before - space.after} given back to the disk)"
    ]
    if space.free_left:
        lines.append(
            f"{space.free_left} bytes of free pages stay in the file: it was created before "
            "trainq gave free pages back; stop the service and run `trainq gc --vacuum` once"
        )
    return "\n".join(lines)


def report(f: Footprint, days: float, *, dry_run: bool) -> str:
    verb = "would purge" if dry_run else "purged"
    lines = [f"{verb} {f.jobs} jobs that ended more than {days:g} days ago"]
    for kind in KINDS:
        lines.append(f"  {kind:<12} {f.rows[kind]:>10} rows {f.bytes[kind]:>15} bytes")
    lines.append(f"  {'total':<12} {'':>10}      {f.total_bytes:>15} bytes")
    return "\n".join(lines)
