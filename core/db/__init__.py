"""The database: the tables (core.db.tables, core.db.registry_tables,
core.db.webhook_tables), the engine and its sessions (core.db.engine),
the database's clock (core.db.clock), the bounds on PostgreSQL's waits (core.db.bounds)
and named locks (core.db.locks). Import the names from here. See docs/operations.md."""

from core.db.bounds import SLOWEST_BYTES_PER_S, DbTimeouts, allow_time_for, statement_bound
from core.db.clock import DbTime, as_utc, db_ago, db_now, utcnow
from core.db.engine import Database, close_quietly, make_engine
from core.db.locks import advisory_key, lock_name
from core.db.registry_tables import AliasMove, Model, ModelAlias, ModelShare, ModelVersion
from core.db.sqlite import READ_ONLY
from core.db.tables import (
    FINAL_COLUMNS,
    Artifact,
    AttemptTime,
    Base,
    Checkpoint,
    DeletedJob,
    EpochMetric,
    Job,
    JobTag,
    Quota,
    StepMetric,
    Sweep,
    UserDataset,
)
from core.db.webhook_tables import (
    WebhookAttemptCount,
    WebhookDelivery,
    WebhookDeliveryState,
    WebhookEndpoint,
    WebhookEvent,
)

__all__ = [
    "FINAL_COLUMNS",
    "READ_ONLY",
    "SLOWEST_BYTES_PER_S",
    "AliasMove",
    "Artifact",
    "AttemptTime",
    "Base",
    "Checkpoint",
    "Database",
    "DbTime",
    "DbTimeouts",
    "DeletedJob",
    "EpochMetric",
    "Job",
    "JobTag",
    "Model",
    "ModelAlias",
    "ModelShare",
    "ModelVersion",
    "Quota",
    "StepMetric",
    "Sweep",
    "UserDataset",
    "WebhookAttemptCount",
    "WebhookDelivery",
    "WebhookDeliveryState",
    "WebhookEndpoint",
    "WebhookEvent",
    "advisory_key",
    "allow_time_for",
    "as_utc",
    "close_quietly",
    "db_ago",
    "db_now",
    "lock_name",
    "make_engine",
    "statement_bound",
    "utcnow",
]
