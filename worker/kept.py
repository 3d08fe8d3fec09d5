"""The data set of the job a worker is about to fork a horse for, kept in the worker's memory
(core.train.kept_data) so that this job and the ones after it on that set do not read it."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

from rq.job import Job

from core.spec import USER_DATASET_PREFIX, JobSpec
from core.train.data import BUILT_IN_CLASSES
from core.train.kept_data import KEPT

log = logging.getLogger("trainq.worker")


def keep_data(job: Job, data_dir: Path) -> None:
    """Before the fork: drop the kept sets if memory is short, then read and keep this job's
    set if it is not kept already. The entry is not yet admitted (worker.admission), so its
    set's name is only read here, checked for form; a kept set is used by a horse only
    after its job was admitted. Any failure leaves the horse to read the set, as before."""
    dropped = KEPT.relieve()
    if dropped:
        log.warning("memory is short: %d kept data set(s) dropped", dropped)
    name = dataset_name(job)
    if name is None:
        return
    try:
        started = time.perf_counter()
        if KEPT.find(name, data_dir) is None and KEPT.fill(name, data_dir):
            log.info("data set %s read and kept in %.2f s", name, time.perf_counter() - started)
    except Exception as e:  # a damaged or missing file: the horse says so in the job
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
