"""A job or sweep named by its id's first characters (client/http.py `whole_id`): the one id
of the caller's that starts so, else a message that says what to give instead; and never a
name the API made up, which `trainq download` would write a file under."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from client.http import IdNotFound, whole_id


def listing(*ids: str) -> Any:
    def listed(prefix: str) -> Iterator[dict[str, Any]]:
        yield from ({"id": i} for i in ids if i.startswith(prefix))

    return listed


def nothing_listed(prefix: str) -> Iterator[dict[str, Any]]:
    raise AssertionError(f"a whole id needs no listing (asked for {prefix})")


def test_a_whole_id_is_taken_as_it_is() -> None:
    job = str(uuid.uuid4())
    assert whole_id("job", job.upper(), nothing_listed) == job


def test_a_unique_prefix_names_its_job() -> None:
    job, other = "abcd1234" + str(uuid.uuid4())[8:], "abce1234" + str(uuid.uuid4())[8:]
    assert whole_id("job", "ABCD", listing(job, other)) == job
    assert whole_id("job", "abcd1234-", listing(job, other)) == job


def test_several_are_listed_and_none_is_said() -> None:
    jobs = [f"abcd{n:04x}" + str(uuid.uuid4())[8:] for n in range(7)]
    with pytest.raises(IdNotFound, match=r"job id abcd is ambiguous: .* and more; give more"):
        whole_id("job", "abcd", listing(*jobs))
    with pytest.raises(IdNotFound, match=f"{jobs[0]}, {jobs[1]}; give more of it"):
        whole_id("job", "abcd", listing(*jobs[:2]))
    with pytest.raises(IdNotFound, match=r"^no sweep beef$"):
        whole_id("sweep", "beef", listing(*jobs))


@pytest.mark.parametrize("given", ["abc", "", "../..", "abcd%", "abcd_", "zzzz", "a" * 37])
def test_what_is_no_id_is_refused_before_any_request(given: str) -> None:
    with pytest.raises(IdNotFound, match="first 4 characters or more"):
        whole_id("job", given, nothing_listed)


@pytest.mark.parametrize(
    "answered", ["../../.bashrc", "abcd", "ffff" + str(uuid.UUID(int=7))[4:]], ids=str
)
def test_an_id_the_api_makes_up_is_refused(answered: str) -> None:
    def lying(prefix: str) -> Iterator[dict[str, Any]]:
        yield {"id": answered}

    with pytest.raises(IdNotFound, match="not job ids"):
        whole_id("job", "abcd", lying)
