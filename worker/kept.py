"""The data set of the job a worker has just run, kept in the worker's memory
(core.train.kept_data) so that the jobs after it on that set do not read it."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

from rq.exceptions import StopRequested
from rq.job import Job

from core.spec import USER_DATASET_PREFIX, JobSpec
from core.train.data import BUILT_IN_CLASSES
from core.train.kept_data import KEPT

log = logging.getLogger("trainq.worker")


def relieve_memory() -> None:
    """Before a fork and at each heartbeat while a horse runs: drop the kept sets whose files
    are gone or changed (a deleted upload), and every kept set if memory has run short. Never
    fatal: a worker whose horse runs must not stop over its kept sets."""
    try:
        dropped = KEPT.relieve()
    except StopRequested:
        raise
    except Exception:
        log.exception("the kept data sets could not be checked; all dropped")
        KEPT.clear()
        return
    if dropped:
        log.warning("%d kept data set(s) dropped: memory is short", dropped)


def keep_data(job: Job, data_dir: Path) -> None:
    """After a job's horse ended: read and keep the set its entry names, if it is in place
    (the horse placed or installed it) and not kept already, so that the horses of the next
    jobs on it find it. Only the name is read from the entry, and checked for form; a horse
    uses a kept set only for a job admitted to train on it. A failure leaves the next horse
    to read the set, as before; a stop asked meanwhile (RQ's StopRequested) goes through."""
    name = dataset_name(job)
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
    name = spec.get("dataset", JobSpec.model_fields["dataset"].default)
    if not isinstance(name, str):
        return None
    if name in BUILT_IN_CLASSES:
        return name
    ds_id = name.removeprefix(USER_DATASET_PREFIX)
    if name.startswith(USER_DATASET_PREFIX) and _is_uuid(ds_id):
        return name
    return None


def _is_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False
