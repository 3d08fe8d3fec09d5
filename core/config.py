"""`Settings`: trainq's configuration, read once from `TRAINQ_*` environment variables.
Every field: the README's settings table."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "trainq"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINQ_", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = None  # default: a SQLite file in data_dir
    redis_url: str | None = None  # default: the embedded redis-server, socket in data_dir
    queue: str = "trainq"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: str = ""  # comma-separated; each key is an owner of its jobs
    admin_keys: str = ""  # comma-separated; these keys see every job
    api_url: str | None = None  # for clients; default http://{host}:{port}
    api_key: str | None = None  # for clients; default the key file in data_dir
    metrics_maxlen: int = Field(200_000, ge=1000, description="Per-job Redis stream bound.")
    heartbeat_timeout_s: float = Field(
        30.0, gt=0, description="A running job whose attempt wrote no heartbeat this long is lost."
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A running attempt whose trainer made no progress this long (no step, "
        "no piece of a step-free phase) is hung: it stops beating, so it is declared lost.",
    )
    export_check_timeout_s: float = Field(
        120.0,
        gt=0,
        description="The fresh process that checks a trained model's formats answers within "
        "this long, or the job is retried elsewhere (as a restart) from its final checkpoint.",
    )
    dataset_keep_mb: int = Field(
        2048,
        ge=0,
        description="Each worker keeps the data sets of its recent jobs in memory, up to this "
        "many MiB (0: none), so the next job on one skips reading it; all are dropped when "
        "the host (or the worker's cgroup) has less than a tenth of its memory, or 1 GiB, free.",
    )
    reconcile_interval_s: float = Field(10.0, gt=0, description="How often workers reconcile.")
    version_skew_pause_s: float = Field(
        5.0,
        ge=0,
        description="A worker that handed back a job it could not read (written by another "
        "trainq: worker.admission) waits this long before it takes another.",
    )
    version_skew_hand_backs: int = Field(
        60,
        ge=0,
        description="A job handed back this many times for version skew fails with "
        "worker_version_skew instead.",
    )
    queue_grace_s: float = Field(
        30.0, ge=0, description="A queued job missing from the queue this long is requeued."
    )
    db_busy_timeout_s: float = Field(15.0, gt=0, description="SQLite: wait for a lock this long.")
    db_connect_timeout_s: float = Field(
        5.0, gt=0, description="PostgreSQL: a new connection is made within this long."
    )
    db_statement_timeout_s: float = Field(
        15.0,
        gt=0,
        description="PostgreSQL: a statement runs at most this long (longer for one that moves "
        "a model, checkpoint or data set, in proportion to its size); a server that does not "
        "answer at all is given up on this long plus the connect timeout after it was asked.",
    )
    db_pool_timeout_s: float = Field(
        5.0,
        gt=0,
        description="An API request waits this long for a free database connection, then "
        "answers 503 with Retry-After.",
    )
    job_timeout_s: int = Field(7 * 24 * 3600, ge=60)
    max_parallel_uploads: int = Field(
        2,
        ge=1,
        description="POST /datasets parsed at once per API process (each may hold a few "
        "times its decompressed size in memory); more answer 429 with Retry-After.",
    )
    upload_max_per_key: int = Field(
        1,
        ge=1,
        description="POST /datasets one key may have parsed at once in one API process; more "
        "answer 429 with Retry-After. Kept below max_parallel_uploads, a key holding its "
        "share leaves the other slots to other keys.",
    )
    upload_max_images: int = Field(
        100_000,
        ge=2,
        le=200_000,  # core.datasets.MAX_IMAGES, not imported: the light client has no numpy
        description="Images (train and test together) one data set upload may hold; an "
        "upload declaring more is refused with 413 from its zip directory or headers, before "
        "any image is read (the work of checking an upload grows with its images).",
    )
    upload_parser_memory: int = Field(
        4 << 30,
        ge=512 << 20,
        description="Bytes of address space the child process that reads one upload may take "
        "(api.parsers); an upload that needs more is refused with 413 and costs the API "
        "nothing. One child runs per upload being checked (max_parallel_uploads).",
    )
    upload_parser_cpu_s: float = Field(
        30.0,
        gt=0,
        description="CPU seconds the child reading one upload may use, plus "
        "upload_parser_cpu_s_per_mib for each MiB of the upload (3 times as many seconds on "
        "the clock); an upload that needs more is refused with 413 and frees its slot.",
    )
    upload_parser_cpu_s_per_mib: float = Field(
        1.0, ge=0, description="CPU seconds an upload's child may use for each MiB it reads."
    )
    predict_parsers: int = Field(
        2,
        ge=1,
        le=64,
        description="Child processes kept warm to decode the image files sent to predict "
        "(each at most 1 GiB of address space and 5 CPU seconds an image); a request that "
        "finds all busy for 5 s answers 503 with Retry-After.",
    )
    max_decode_bytes: int = Field(
        256 << 20,
        ge=128 << 20,
        description="Bytes the images being decoded for predictions may hold at once in one "
        "API process (one image holds at most 64 MiB and a few strips); a request that "
        "cannot get its share within 5 s answers 503 with Retry-After.",
    )
    submit_redis_timeout_s: float = Field(
        2.0,
        gt=0,
        description="The API's enqueue of new jobs waits for Redis at most this long (twice, "
        "with one retry); it runs inside the jobs' open database transaction.",
    )
    sse_max_per_key: int = Field(
        20,
        ge=1,
        description="Event streams (GET /jobs/{id}/events) one key may hold open at once in "
        "one API process; more answer 429 with Retry-After.",
    )
    sse_max_per_process: int = Field(
        1000,
        ge=1,
        description="Event streams one API process holds open at once, all keys together; "
        "more answer 429 with Retry-After.",
    )
    download_max_per_key: int = Field(
        4,
        ge=1,
        description="Model downloads one key may hold open at once in one API process (each "
        "holds a copy of its model in data_dir/downloads while its client reads); more "
        "answer 429.",
    )
    download_max_per_process: int = Field(
        8,
        ge=1,
        description="Model downloads one API process holds open at once, all keys together "
        "(each copies its model out of the database first); more answer 429.",
    )
    download_send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A download whose client takes less than a chunk (1 MiB) in this long is "
        "cut off, and its slot freed: a client that stopped reading, or reads slower than a "
        "MiB in this time, holds a slot no longer.",
    )
    sse_max_lag: int = Field(
        10_000,
        ge=10,
        description="Live entries a follower's connection may leave untaken (a client that "
        "reads slower than its job trains, or not at all); past it the follower gets a "
        "`lagging` event and is dropped, and resumes with Last-Event-ID.",
    )
    commit_wait_s: float = Field(
        5.0,
        gt=0,
        description="A worker handed a job the API enqueued waits this long for the API to "
        "commit its row, then refuses the entry (the submission failed).",
    )

    fair_share: bool = Field(
        True,
        description="A free worker takes the job of the owner with the fewest running jobs "
        "(worker.fair_share); false: the queue's head, first in first out.",
    )

    # Quotas per key (core.quotas): the defaults; an admin overrides them per key with
    # PUT /quotas/{owner}. None: no limit. Admin keys have none.
    quota_max_queued: int | None = Field(
        1000, ge=0, description="Jobs a key may have queued at once; more answer 429."
    )
    quota_max_running: int | None = Field(
        None, ge=1, description="Jobs of a key that run at once; the rest wait in the queue."
    )
    quota_max_dataset_bytes: int | None = Field(
        10 * 2**30, ge=0, description="Bytes of uploaded data sets a key may hold."
    )
    quota_max_train_hours_per_day: float | None = Field(
        None, gt=0, description="Hours of training a key may use in any 24 hours."
    )

    sweep_max_running_per_key: int = Field(
        20,
        ge=1,
        le=10_000,
        description="Sweeps one key may have running at once; another POST /sweeps answers "
        "429 (admin keys have no limit). Every running sweep is looked at in each reconciler "
        "pass.",
    )

    retention_days: float | None = Field(
        None,
        gt=0,
        description="Ended jobs whose finished_at is older lose their step rows, checkpoint "
        "and model (core.retention); their row, epochs and result stay. None: kept forever.",
    )
    retention_batch: int = Field(
        100, ge=1, description="Jobs the retention pass purges per reconcile pass at most."
    )

    # Signed webhooks (core.webhooks): where they may go, how long one may take.
    webhook_allow_hosts: str = Field(
        "",
        description="Comma-separated host names and address ranges (CIDR, or one address) "
        "that webhooks may reach although they are loopback, private, link-local or "
        "otherwise internal: every other such address is refused.",
    )
    webhook_max_endpoints_per_key: int = Field(
        20, ge=1, le=1000, description="Webhook endpoints one key may register; more answer 429."
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=60,
        description="A webhook delivery (connect, send, the answer's first few KiB) ends "
        "within this long, or fails and is retried. A delivery whose dispatcher died is "
        "taken again six times this long after it was taken (its lease).",
    )
    webhook_max_in_flight_per_endpoint: int = Field(
        1,
        ge=1,
        le=8,
        description="Webhook deliveries under way to one endpoint at once, across every "
        "dispatcher: a receiver that hangs holds this many, and no other endpoint waits for "
        "it. At 1, an endpoint's events are sent one after the other, oldest first.",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @cached_property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'trainq.db'}"

    @property
    def client_url(self) -> str:
        return self.api_url or f"http://{self.host}:{self.port}"

    @property
    def key_file(self) -> Path:
        return self.data_dir / "api_key"

    @property
    def api_key_list(self) -> list[str]:
        return [k.strip() for k in self.api_keys.split(",") if k.strip()]

    @property
    def admin_key_list(self) -> list[str]:
        return [k.strip() for k in self.admin_keys.split(",") if k.strip()]
