"""One record of a step, written three times: the trainer's StepMetrics, the step_metrics
row and the API's MetricPoint, so that neither the database nor the API imports torch
(core.train). This fails when one of them gains, loses or reorders a field."""

from __future__ import annotations

from dataclasses import fields

from api.schemas import METRIC_FIELDS, MetricPoint
from core.db import StepMetric
from core.train import StepMetrics

TRAINER = [(f.name, f.type) for f in fields(StepMetrics)]  # types as written: "int", "float"


def test_the_step_row_has_the_trainers_fields_in_its_order() -> None:
    columns = [c for c in StepMetric.__table__.columns if c.key != "job_id"]
    assert [(c.key, c.type.python_type.__name__) for c in columns] == TRAINER


def test_the_apis_metric_point_has_the_trainers_fields_in_its_order() -> None:
    points = MetricPoint.model_fields.items()
    assert [(name, getattr(f.annotation, "__name__", None)) for name, f in points] == TRAINER
    assert [name for name, _ in TRAINER] == list(METRIC_FIELDS)
