"""Backups of a trainq whose database is SQLite, and their restore. A backup is a folder:
the database copied online through SQLite's backup API (a consistent snapshot, the pages
still in the write-ahead log included, which a copy of the file misses; the service goes on
writing meanwhile) and the data folder's files a restored service needs besides it
(DATA_FILES). Redis is not in it: the database is the source of truth, and the reconciler
enqueues again every queued job whose entry is gone. A restore checks a copy of the backup
(integrity, schema revision), brings it to this trainq's schema, pauses webhook delivery in
it, and only then renames it over the database. PostgreSQL is backed up with pg_dump.
See docs/operations.md ("Backup and restore")."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from core.config import Settings
from core.db import Database
from core.errors import BackupInvalid, BackupRefused
from core.files import write_atomic
from core.schema import database_revision, known_revisions, upgrade
from core.webhooks.delivery_state import pause_delivery

DATABASE_FILE = "trainq.db"  # the database's name inside a backup folder
DATA_FILES = ("api_key",)  # of the data folder: the local key (`trainq up`'s own)
STAGED = ".restoring"  # the checked copy beside the database, until it is renamed over it
BUSY_TIMEOUT_S = 30.0  # a copy waits this long for a writer to let go


def sqlite_path(settings: Settings) -> Path:
    """The database's file; BackupRefused where the database is not SQLite."""
    url = make_url(settings.resolved_database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        raise BackupRefused(
            f"the database is {url.get_backend_name()}, not a SQLite file: back it up and "
            "restore it with its own tools (pg_dump and pg_restore for PostgreSQL: "
            "docs/operations.md)"
        )
    return Path(url.database)


def backup(settings: Settings, dest: Path) -> str:
    """The database and DATA_FILES into the folder `dest` (made; it must hold no backup yet),
    the database checked once copied. Returns its schema revision."""
    source = sqlite_path(settings)
    if not source.exists():
        raise BackupRefused(f"there is no database at {source} to back up")
    target = dest / DATABASE_FILE
    if target.exists():
        raise BackupRefused(f"{dest} holds a backup already: name a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / f"{DATABASE_FILE}.partial"
    try:
        copy_database(source, partial)
        revision = check(partial)
        os.replace(partial, target)
    finally:
        _remove_database(partial)  # what a failed copy left
    _sync_folder(dest)
    for name in DATA_FILES:
        _copy_private(settings.data_dir / name, dest / name)
    return revision


def restore(settings: Settings, src: Path) -> str:
    """The backup in `src` in place of the database and DATA_FILES. Nothing is replaced
    before the copy passed its checks; the database is replaced by a rename. Returns the
    revision of the backup. The caller makes sure no service uses the data folder."""
    backed_up = src / DATABASE_FILE
    if not backed_up.is_file():
        raise BackupInvalid(f"{src} holds no {DATABASE_FILE}: it is not a trainq backup")
    target = sqlite_path(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    _refuse_if_open(target)
    staged = target.with_name(target.name + STAGED)
    _remove_database(staged)
    try:
        copy_database(backed_up, staged)
        revision = check(staged)
        prepare(staged)
        _remove_database(target, keep_main=True)
        os.replace(staged, target)
    finally:
        _remove_database(staged)
    _sync_folder(target.parent)
    for name in DATA_FILES:
        _copy_private(src / name, settings.data_dir / name)
    return revision


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite database `source` (its write-ahead log included) as
    one self-contained file, `target`, flushed to disk; BackupInvalid if SQLite cannot (not
    a database, a full disk)."""
    try:
        with (
            contextlib.closing(sqlite3.connect(source, timeout=BUSY_TIMEOUT_S)) as src,
            contextlib.closing(sqlite3.connect(target)) as dst,
        ):
            src.backup(dst)  # every page in one step: one read snapshot, writers go on
            dst.execute("PRAGMA journal_mode=DELETE")  # the copy needs no log beside it
    except sqlite3.Error as e:
        raise BackupInvalid(f"SQLite could not copy {source}: {e}") from e
    with open(target, "rb+") as f:
        os.fsync(f.fileno())


def check(path: Path) -> str:
    """The copy's schema revision, once SQLite's integrity check passed and the revision is
    one this trainq knows; BackupInvalid otherwise."""
    try:
        with contextlib.closing(sqlite3.connect(path)) as c:
            found = [row[0] for row in c.execute("PRAGMA integrity_check")]
    except sqlite3.DatabaseError as e:
        raise BackupInvalid(f"the copy is no database SQLite can read: {e}") from e
    if found != ["ok"]:
        raise BackupInvalid(f"the copy failed SQLite's integrity check: {found[:5]}")
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            revision = database_revision(conn)
    finally:
        engine.dispose()
    if revision is None or revision not in known_revisions():
        raise BackupInvalid(
            f"the copy is at schema revision {revision}, which this trainq does not know: "
            "restore it with the trainq that made it, or a newer one"
        )
    return revision


def prepare(path: Path) -> None:
    """The checked copy brought to this trainq's schema (as `trainq migrate` would), with
    webhook delivery paused in it: a restored service sends nothing until an operator has
    looked (its events may have been sent once already) and resumed it."""
    url = f"sqlite:///{path}"
    upgrade(url)
    db = Database(url)
    try:
        with db.writer() as s:
            pause_delivery(s, by="trainq restore", reason="restored from a backup")
    finally:
        db.dispose()
    with contextlib.closing(sqlite3.connect(path)) as c:
        c.execute("PRAGMA journal_mode=DELETE")  # its log folded in: one file to rename


def _refuse_if_open(database: Path) -> None:
    """BackupRefused while any other process has the database (or its log) open: `trainq
    serve` and `trainq worker` hold no lock on the data folder, and a file renamed under
    them would lose what they write next. Read from /proc (Linux); elsewhere not checked."""
    names = {str(database.resolve()) + end for end in ("", "-wal", "-shm")}
    users = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if os.readlink(fd) in names and int(fd.parts[2]) != os.getpid():
                users.add(int(fd.parts[2]))
    if users:
        pids = ", ".join(str(p) for p in sorted(users))
        raise BackupRefused(
            f"the database is open in process {pids} (a trainq serve or worker?): stop every "
            "process that uses it, then restore"
        )


def _remove_database(path: Path, *, keep_main: bool = False) -> None:
    """A database's log, shared-memory and migration-lock files (and the file, unless
    `keep_main`): a log left beside another file would be replayed into it."""
    names = [f"{path.name}{end}" for end in ("-wal", "-shm", "-journal", ".migrate-lock")]
    for name in names if keep_main else [path.name, *names]:
        (path.parent / name).unlink(missing_ok=True)


def _copy_private(source: Path, target: Path) -> None:
    """A data folder's file (a key: readable by its owner only) copied, if there is one."""
    if not source.is_file():
        return
    if not target.exists():
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))  # write_atomic keeps it
    write_atomic(target, source.read_bytes())


def _sync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
