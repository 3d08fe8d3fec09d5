"""`trainq sweep --json FILE`: a body whose parts are the wrong JSON type is refused with a
message (FlagError), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import parser_for
from cli.sweep_args import FlagError, sweep_body


@pytest.mark.parametrize(
    "body",
    [
        {"space": {"lr": {"choice": [0.001, 0.002]}}, "sampler": "tpe"},
        {"space": {"lr": {"choice": [0.001, 0.002]}}, "pruner": ["asha"]},
        {"base": ["mnist"], "space": {"lr": {"choice": [0.001]}}},
        {"space": "lr"},
    ],
)
def test_a_json_body_of_the_wrong_shape_is_a_message(tmp_path: Path, body: object) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(body))
    argv = ["sweep", "--json", str(path)]
    args = parser_for(argv).parse_args(argv)
    with pytest.raises(FlagError):  # today: TypeError "'str' object is not a mapping"
        sweep_body(args)
