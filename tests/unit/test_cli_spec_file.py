"""`--spec FILE` with options over it: a job's spec as the file (GET /jobs/{id}'s `spec`)
takes an option over a knob its recipe filled, and another recipe for the rest."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli.options import add_spec_options, spec_from_args
from core.spec import JobSpec


def spec_of(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_spec_options(parser)
    return spec_from_args(parser.parse_args(argv)).model_dump(mode="json")


def test_a_jobs_spec_as_the_file_takes_options_over_what_its_recipe_filled(tmp_path: Path) -> None:
    stored = tmp_path / "job.json"
    stored.write_text(json.dumps(JobSpec(lr=0.005).model_dump(mode="json")))
    assert spec_of("--spec", str(stored)) == json.loads(stored.read_text())
    shorter = spec_of("--spec", str(stored), "--epochs", "3")
    assert (shorter["epochs"], shorter["lr"], shorter["batch_size"]) == (3, 0.005, 64)
    assert "epochs" not in shorter["recipe_filled"] and "batch_size" in shorter["recipe_filled"]
    fast = spec_of("--spec", str(stored), "--recipe", "fast")
    assert (fast["epochs"], fast["lr"], fast["batch_size"]) == (1, 0.005, 256)


def test_a_file_whose_recipe_filled_is_false_is_refused_as_the_api_refuses_it(
    tmp_path: Path,
) -> None:
    forged = JobSpec().model_dump(mode="json") | {"epochs": 2}
    stored = tmp_path / "job.json"
    stored.write_text(json.dumps(forged))
    with pytest.raises(ValidationError, match="epochs is not the accurate recipe's 8"):
        spec_of("--spec", str(stored))
    with pytest.raises(ValidationError, match="epochs is not the fast recipe's 1"):
        spec_of("--spec", str(stored), "--recipe", "fast")


def test_what_submit_sends_reads_back_as_the_spec_it_checked() -> None:
    """`trainq submit` sends the spec without its defaults: a knob given at the field's
    default (8 epochs under fast) is left out, and must not become the recipe's."""
    for given in ({"recipe": "fast", "epochs": 8}, {"recipe": "fast"}, {"epochs": 3}, {}):
        spec = JobSpec.model_validate(given)
        sent = spec.model_dump(mode="json", exclude_defaults=True)
        assert JobSpec.model_validate(sent) == spec
