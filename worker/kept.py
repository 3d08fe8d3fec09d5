"""The data set of the job a worker has just run, kept in the worker's memory
(core.train.kept_data) so that the jobs after it on that set do not read it: its horse tells
the worker which set its admitted job trained on (`Told`), and the worker reads that one."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from rq.exceptions import StopRequested
from rq.job import Job

from core.queue import is_uuid
from core.spec import DATASETS, USER_DATASET_PREFIX, JobSpec
from core.train.kept_data import KEPT

log = logging.getLogger("trainq.worker")


def relieve_memory(need: int = 0, *, check_files: bool = True) -> None:
    """Before a fork (`need`: what the horse will read, its set not kept) and at each
    heartbeat while a horse runs (memory only): drop the kept sets whose files are gone or
    changed (a deleted upload), and every kept set if memory is short of `need` more. Never
    fatal: a worker whose horse runs must not stop over its kept sets."""
    try:
        dropped = KEPT.relieve(need, check_files=check_files)
    except StopRequested:
        raise
    except Exception:
        log.exception("the kept data sets could not be checked; all dropped")
        KEPT.clear()
        return
    if dropped:
        log.warning("%d kept data set(s) dropped: memory is short", dropped)


class Told:
    """What a work horse tells its worker: the data set its admitted job trained on (written
    once the set is placed), over a pipe the worker makes before each fork. The worker keeps
    that set, and none that an entry merely names (a refused or superseded entry, a spec
    that differs from its job's row)."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()  # neither outlives an exec

    def tell(self, name: str) -> None:
        """In the horse. Never fatal: the job goes on whatever the pipe does."""
        with contextlib.suppress(OSError):
            os.write(self.write_end, name.encode()[:MAX_NAME] + b"\n")

    def heard(self) -> str | None:
        """In the worker, once the horse ended (or was never forked): the name told, if one
        was. Never waits: a horse or its children still holding the pipe tell nothing."""
        os.close(self.write_end)
        try:
            os.set_blocking(self.read_end, False)
            told = os.read(self.read_end, MAX_NAME + 2).split(b"\n", 1)[0]
        except OSError:  # BlockingIOError: nothing was written
            told = b""
        finally:
            os.close(self.read_end)
        return told.decode("utf-8", "replace") or None


MAX_NAME = 128
TOLD: Told | None = None  # set by the worker before each fork; a horse inherits it


def tell_worker(name: str) -> None:
    """In a work horse: its job's admitted set, for its worker to keep (worker.rq_worker)."""
    if TOLD is not None:
        TOLD.tell(name)


def keep_data(name: str | None, data_dir: Path) -> None:
    """After a job's horse ended: read and keep the set it trained on, if it is in place and
    not kept already, so that the horses of the next jobs on it find it. A failure leaves
    the next horse to read the set, as before; a stop asked meanwhile (RQ's StopRequested)
    goes through."""
    name = well_formed(name)
    if name is None:
        return
    try:
        started = time.perf_counter()
        if KEPT.find(name, data_dir) is None and KEPT.fill(name, data_dir):
            log.info("data set %s read and kept in %.2f s", name, time.perf_counter() - started)
    except StopRequested:
        raise
    except Exception as e:  # a damaged or missing file: the next horse says so in its job
        log.info("data set %s not kept: %s", name, e)


def dataset_name(job: Job) -> str | None:
    """The data set a queue entry names, if it is a well-formed name of one."""
    try:
        spec = job.kwargs.get("spec") if job.kwargs else (job.args[0] if job.args else None)
    except Exception:  # an entry RQ cannot decode: RQ says so as it runs it
        return None
    if not isinstance(spec, dict):
        return None
    return well_formed(spec.get("dataset", JobSpec.model_fields["dataset"].default))


def need_for(job: Job, data_dir: Path) -> int:
    """Bytes the horse of this entry may read: its set's estimate unless it is kept."""
    name = dataset_name(job)
    try:
        return 0 if name is None else KEPT.need(name, data_dir)
    except Exception:  # only an estimate: never fatal
        return 0


def well_formed(name: object) -> str | None:
    """`name` if it is a built-in set's or an upload's canonical "ds:<uuid>" (no path)."""
    if not isinstance(name, str):
        return None
    if name in DATASETS:
        return name
    ds_id = name.removeprefix(USER_DATASET_PREFIX)
    if name.startswith(USER_DATASET_PREFIX) and is_uuid(ds_id):
        return name
    return None
