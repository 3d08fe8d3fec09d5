"""`trainq compare` reads a stored spec as the worker does (core.spec.stored_spec)."""

from __future__ import annotations

from cli.compare_cmd import full_spec, spec_diff
from core.spec import BEFORE_FIELD, JobSpec, stored_spec


def test_a_spec_stored_before_a_field_compares_as_the_worker_reads_it() -> None:
    today = JobSpec(epochs=3).model_dump(mode="json")
    old = {k: v for k, v in today.items() if k not in BEFORE_FIELD}
    read = stored_spec(old).model_dump(mode="json")
    assert full_spec(old) == read
    assert spec_diff([old, read]) == ([], len(read))
    assert spec_diff([old, today])[0] == sorted(
        set(BEFORE_FIELD) - {"recipe"}, key=list(today).index
    )
