"""`trainq backup DEST` and `trainq restore SRC`: a SQLite-backed trainq's database and data
folder files, copied online and put back (core.backup); a restore refuses to run while a
`trainq up` holds the data folder. See docs/operations.md ("Backup and restore")."""

from __future__ import annotations

import argparse
import os
import sys

from core.config import Settings
from core.errors import BackupInvalid, BackupRefused


def backup_command(args: argparse.Namespace) -> int:
    from core.backup import backup

    try:
        revision = backup(Settings(), args.dest)
    except (BackupRefused, BackupInvalid) as e:
        print(f"trainq backup: {e}", file=sys.stderr)
        return 2
    print(f"backed up to {args.dest} (schema revision {revision}, integrity checked)")
    return 0


def restore_command(args: argparse.Namespace) -> int:
    from cli.local.data_dir_lock import DataDirInUse, hold_data_dir
    from core.backup import restore

    settings = Settings()
    try:
        lock = hold_data_dir(settings.data_dir)  # and no `trainq up` starts meanwhile
    except DataDirInUse as e:
        print(f"trainq restore: refused, nothing replaced: {e}", file=sys.stderr)
        return 1
    try:
        revision = restore(settings, args.src)
    except (BackupRefused, BackupInvalid) as e:
        print(f"trainq restore: refused, nothing replaced: {e}", file=sys.stderr)
        return 2
    finally:
        os.close(lock)
    print(
        f"restored {args.src} (schema revision {revision}, now at this trainq's); webhook "
        "delivery is paused: resume it once you have checked the service "
        "(`trainq webhook resume`)"
    )
    return 0
