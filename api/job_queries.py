"""GET /jobs's query string, read into a search (core.store.search): the filters, the order
and where the page starts. Each parameter is checked here, so that a bad one is a 422
naming it. See docs/api.md ("Finding jobs")."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Query

from api.access import IdPrefix
from api.cursors import JobCursor
from core.labels import NAME_MAX, TAGS_MAX, Tag
from core.spec import Architecture, JobStatus, user_dataset_id
from core.store.search import JobFilters, Position, Sort, SortKey
from core.text import PLAIN_PATTERN

SORT_PATTERN = rf"^-?({'|'.join(k.value for k in SortKey)})$"
SORT_HELP = (
    "The order: `created` (oldest first) or `-created` (newest first, the default), "
    "`duration`, or a final figure: `test_accuracy`, `test_loss`, `train_accuracy`, "
    "`train_loss`, `images_per_second`; `-` first for the highest first. A figure or the "
    "duration lists only the jobs that have it (those that succeeded). Ties are ordered by id."
)


@dataclass(frozen=True)
class JobQuery:
    filters: JobFilters
    sort: Sort
    after: Position | None

    def cursor(self, last: Position) -> str:
        """The cursor of the page that follows one ending at `last`."""
        return JobCursor(self.sort, self.filters.digest(), last).encode()


# The parameters, each with the check that makes a bad one a 422 naming it.
StatusParam = Annotated[
    list[JobStatus] | None,
    Query(max_length=len(JobStatus), description="Only these statuses (repeat it: any of them)."),
]
TagParam = Annotated[
    list[Tag] | None,
    Query(max_length=TAGS_MAX, description="Only jobs with this tag (repeat it: all of them)."),
]
NameParam = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=NAME_MAX,
        pattern=PLAIN_PATTERN,
        description="Only names that start with this, whatever their case.",
    ),
]
DatasetParam = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        pattern=PLAIN_PATTERN,
        description='Only jobs on this data set (a built-in name, or "ds:<id>").',
    ),
]
ModelParam = Annotated[Architecture | None, Query(description="Only this architecture.")]
SweepIdParam = Annotated[uuid.UUID | None, Query(description="Only this sweep's trials.")]
CreatedAfterParam = Annotated[
    dt.datetime | None,
    Query(description="Created at or after this time (ISO 8601; UTC if no zone is given)."),
]
CreatedBeforeParam = Annotated[
    dt.datetime | None, Query(description="Created before this time (ISO 8601).")
]
SortParam = Annotated[str, Query(pattern=SORT_PATTERN, description=SORT_HELP)]
CursorParam = Annotated[
    str | None,
    Query(
        max_length=200,
        pattern=PLAIN_PATTERN,
        description="The previous page's `next`, with the same filters and sort.",
    ),
]


def job_query(
    status: StatusParam = None,
    tag: TagParam = None,
    name: NameParam = None,
    dataset: DatasetParam = None,
    model: ModelParam = None,
    sweep_id: SweepIdParam = None,
    id_prefix: IdPrefix = None,
    created_after: CreatedAfterParam = None,
    created_before: CreatedBeforeParam = None,
    sort: SortParam = "-created",
    cursor: CursorParam = None,
) -> JobQuery:
    filters = JobFilters(
        statuses=tuple(sorted(set(status or ()))),
        tags=tuple(sorted(set(tag or ()))),
        name_prefix=name,
        dataset=_dataset(dataset),
        model=model.value if model else None,
        sweep_id=str(sweep_id) if sweep_id else None,
        id_prefix=id_prefix.lower() if id_prefix else None,
        created_after=created_after,
        created_before=created_before,
    )
    order = Sort.parse(sort)
    after = JobCursor.decode(cursor, order, filters) if cursor else None
    return JobQuery(filters, order, after)


def _dataset(name: str | None) -> str | None:
    """As a spec names it: an uploaded set's id in lower case."""
    ds_id = user_dataset_id(name) if name else None
    if ds_id is None:
        return name
    try:
        return f"ds:{uuid.UUID(ds_id)}"
    except ValueError:
        return name


JobQueryDep = Annotated[JobQuery, Depends(job_query)]
