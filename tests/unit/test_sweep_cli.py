"""`trainq sweep`'s flags made into the body of POST /sweeps: each form, fixed values, the
sweep's own options, and the forms refused before any request; the table and the report
read from a sweep as the API answers it; a 422 and a 429 as the terminal shows them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from cli.compare_cmd import compare_table
from cli.main import parser_for
from cli.problems import INVALID, field_problems, quota_message, refused
from cli.sweep_args import FlagError, scalar, sweep_body
from cli.sweep_cmd import ended
from cli.sweep_view import final_report, trial_table
from client.http import ApiError
from core.spec import JobSpec


def parsed(*flags: str) -> argparse.Namespace:
    argv = ["sweep", *flags]
    return parser_for(argv).parse_args(argv)


def body(*flags: str) -> dict[str, Any]:
    return sweep_body(parsed(*flags))


@pytest.mark.parametrize(
    ("flag", "text", "field", "dimension"),
    [
        ("--lr", "uniform:1e-4,1e-2", "lr", {"uniform": [1e-4, 1e-2]}),
        ("--lr", "loguniform:1e-4,1e-2", "lr", {"log_uniform": [1e-4, 1e-2]}),
        ("--epochs", "int:1,8", "epochs", {"int_uniform": [1, 8]}),
        ("--hidden", "logint:32,512", "hidden", {"log_int_uniform": [32, 512]}),
        ("--batch-size", "64,128,256", "batch_size", {"choice": [64, 128, 256]}),
        ("--augment", "none,shift,affine", "augment", {"choice": ["none", "shift", "affine"]}),
        ("--ema-decay", "null,0.999", "ema_decay", {"choice": [None, 0.999]}),
        ("--channels-last", "true,false", "channels_last", {"choice": [True, False]}),
        ("--job-seed", "1,2", "seed", {"choice": [1, 2]}),  # --seed is the sampler's
    ],
)
def test_each_form_is_a_dimension_of_the_space(
    flag: str, text: str, field: str, dimension: dict[str, Any]
) -> None:
    made = body(flag, text)
    assert made["space"] == {field: dimension}
    assert made["base"] == {}


def test_a_single_value_is_fixed_in_the_base() -> None:
    made = body("--lr", "1e-3,3e-3", "--epochs", "8", "--augment", "none", "--export", "onnx,pt2")
    assert made["base"] == {"epochs": 8, "augment": "none", "export": ["onnx", "pt2"]}
    assert made["space"] == {"lr": {"choice": [1e-3, 3e-3]}}


def test_the_sweep_options() -> None:
    made = body(
        "--lr", "loguniform:1e-4,1e-2",
        "--objective", "test_loss:min",
        "--sampler", "random", "--seed", "7",
        "--pruner", "hyperband", "--min-epochs", "2", "--reduction-factor", "4",
        "--trials", "16", "--parallel", "2",
    )  # fmt: skip
    assert made["objective"] == {"metric": "test_loss", "direction": "minimize"}
    assert made["sampler"] == {"name": "random", "seed": 7}
    assert made["pruner"] == {"name": "hyperband", "min_epochs": 2, "reduction_factor": 4}
    assert (made["trials"], made["parallel"]) == (16, 2)


def test_options_left_out_are_the_services_defaults() -> None:
    assert set(body("--lr", "1e-3,3e-3")) == {"base", "space"}


def test_flags_override_a_json_body(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(
        json.dumps(
            {
                "base": {"epochs": 2, "batch_size": 64},
                "space": {"lr": {"choice": [1e-3, 3e-3]}},
                "sampler": {"name": "grid", "seed": 1},
                "trials": 2,
            }
        )
    )
    made = body("--json", str(path), "--epochs", "3", "--seed", "5", "--hidden", "64,128")
    assert made["base"] == {"epochs": 3, "batch_size": 64}
    assert made["space"] == {"lr": {"choice": [1e-3, 3e-3]}, "hidden": {"choice": [64, 128]}}
    assert made["sampler"] == {"name": "grid", "seed": 5} and made["trials"] == 2


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--lr", "foo:1,2"), "--lr foo:1,2: unknown form 'foo'"),
        (("--lr", "uniform:1e-2"), "--lr uniform:1e-2: give two bounds"),
        (("--lr", "loguniform:a,b"), "--lr loguniform:a,b: the bounds must be numbers"),
        (("--epochs", "int:1.5,4"), "--epochs int:1.5,4: the bounds must be integers"),
        (("--lr", "uniform:1e-2,1e-4"), "--lr uniform:1e-2,1e-4: LO 0.01 is above HI"),
        (("--batch-size", "64,,128"), "--batch-size 64,,128: an empty item"),
        (("--lr", "1e-3,3e-3", "--objective", "test_loss:down"), "the direction is max or min"),
        (("--epochs", "4"), "nothing to search"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flags: tuple[str, ...], says: str) -> None:
    with pytest.raises(FlagError) as e:
        body(*flags)
    assert says in str(e.value)


def test_a_name_with_a_colon_is_a_value_not_a_form() -> None:
    made = body("--dataset", "ds:0f8b7f4e", "--lr", "1e-3,3e-3")
    assert made["base"] == {"dataset": "ds:0f8b7f4e"}


@pytest.mark.parametrize(
    ("text", "value"),
    [("64", 64), ("1e-3", 1e-3), ("0.5", 0.5), ("true", True), ("null", None),
     ("none", "none"), ("inf", "inf"), ("cosine", "cosine")],
)  # fmt: skip
def test_scalars(text: str, value: Any) -> None:
    assert scalar(text) == value and type(scalar(text)) is type(value)


def trial(number: int, status: str, lr: float, values: list[float]) -> dict[str, Any]:
    return {
        "number": number,
        "job_id": f"job-{number}",
        "status": status,
        "params": {"lr": lr},
        "value": values[-1] if values else None,
        "values": values,
        "error": None,
    }


SWEEP = {
    "id": "5e1f0c9a-0000-4000-8000-000000000000",
    "status": "succeeded",
    "spec": {"space": {"lr": {"choice": [3e-3, 2e-6]}, "epochs": 2}},
    "objective": {"metric": "test_accuracy", "direction": "maximize"},
    "waiting": None,
    "budget": {"trials": 2, "created": 2, "in_flight": 0, "ended": 2, "pruned": 1, "epochs": 3},
    "best": {"number": 0, "job_id": "job-0", "value": 0.9123, "params": {"lr": 3e-3}},
    "trials": [trial(0, "succeeded", 3e-3, [0.8, 0.9123]), trial(1, "pruned", 2e-6, [0.11])],
}


def test_the_table_marks_the_best_trial() -> None:
    assert [line.split() for line in trial_table(SWEEP)] == [
        ["trial", "status", "lr", "test_accuracy", "epochs"],
        ["0*", "succeeded", "0.003", "0.9123", "2"],
        ["1", "pruned", "2e-06", "0.1100", "1"],
    ]


def test_the_report_ends_with_the_best_trial_and_its_download() -> None:
    report = final_report(SWEEP)
    assert report[-3].startswith("best: trial 0  test_accuracy 0.9123  lr=0.003")
    assert report[-1] == "download its model: trainq download job-0"


def test_a_422_names_each_field_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    detail = [
        {"loc": ["body", "space", "lr", "log_uniform"], "msg": "20.0 is outside JobSpec's lr"},
        {"loc": ["body", "trials"], "msg": "Input should be greater than or equal to 1"},
    ]
    assert refused(ApiError(422, detail), "the sweep") == INVALID
    err = capsys.readouterr().err
    assert "space.lr.log_uniform: 20.0 is outside JobSpec's lr" in err
    assert "trials: Input should be" in err
    assert field_problems("not a list") == ["not a list"]


def test_a_429_says_the_quota_and_when_to_retry() -> None:
    body_ = {
        "detail": "max_queued reached",
        "limit": "max_queued",
        "value": 4,
        "usage": 4,
        "owner": "o",
        "retry_after_s": 30,
    }
    text = quota_message(ApiError(429, body_["detail"], body_, "30"))
    assert text == "max_queued reached (max_queued: 4 of 4 in use); retry after 30 s"
    no_wait = quota_message(ApiError(429, "over", {**body_, "retry_after_s": None}))
    assert no_wait.endswith("waiting will not help")


@pytest.mark.parametrize(("status", "code"), [("succeeded", 0), ("failed", 1), ("canceled", 3)])
def test_the_exit_code_says_how_the_sweep_ended(
    status: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ended({**SWEEP, "status": status}) == code
    err = capsys.readouterr().err
    assert (f"{status} (exit {code})" in err) == (code != 0)


def test_compare_shows_only_the_fields_that_differ() -> None:
    jobs = [
        {"id": "9c88f067-34fe", "status": "succeeded", "spec": {"epochs": 2, "lr": 3e-3}},
        {"id": "fa7000e0-c11d", "status": "pruned", "spec": {"lr": 1e-6, "epochs": 2}},
    ]
    metrics = [{"test_accuracy": 0.938, "epochs": 2}, {"test_accuracy": 0.104, "epochs": 1}]
    lines = [line.split() for line in compare_table(jobs, metrics)]
    assert lines[:2] == [["9c88f067", "fa7000e0"], ["lr", "0.003", "1e-06"]]
    # Every other field of the JobSpec is equal (defaults filled in): counted, not listed.
    assert lines[2][0] == f"({len(JobSpec.model_fields) - 1}" and lines[3] == []
    assert lines[4:] == [
        ["status", "succeeded", "pruned"],
        ["test_accuracy", "0.9380", "0.1040"],
        ["epochs", "2", "1"],
    ]
