"""The dashboard labels its form with each JobSpec field's `title` from the OpenAPI schema:
every field names itself in words, not as pydantic's title-cased field name ("Lr")."""

from __future__ import annotations

from core.spec import JobSpec


def test_every_field_has_a_title_of_its_own() -> None:
    untitled = [name for name, field in JobSpec.model_fields.items() if not field.title]
    assert untitled == []


def test_the_schema_carries_the_titles() -> None:
    properties = JobSpec.model_json_schema()["properties"]
    assert properties["lr"]["title"] == "Learning rate"
    assert properties["amp"]["title"] == "Mixed precision"
    assert properties["batch_size"]["title"] == "Batch size"
