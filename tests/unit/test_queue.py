"""The queue contract (worker.entry_checks.contract_violation) on payloads as RQ's JSON serializer
writes them."""

from __future__ import annotations

import uuid
import zlib
from typing import Any

import pytest
from rq.serializers import JSONSerializer

from core.queue import MAX_PAYLOAD_BYTES, TASK
from worker.entry_checks import QueueEntry, contract_violation, inflate

JOB = str(uuid.uuid4())


def entry(
    function: str = TASK,
    args: list[Any] | None = None,
    kwargs: Any = None,
    entry_id: str = JOB,
    **extras: Any,
) -> QueueEntry:
    call = (function, None, args or [], {"spec": {}} if kwargs is None else kwargs)
    return QueueEntry(id=entry_id, payload=JSONSerializer.dumps(call), **extras)


@pytest.mark.parametrize(
    "ok",
    [
        entry(kwargs={"spec": {"epochs": 1}}),
        entry(kwargs={"spec": {}, "owner": "k_0123", "via": "api", "job_id": None}),
        entry(kwargs={"spec": {}, "job_id": JOB}, entry_id=f"{JOB}-a2"),
        entry(kwargs={"spec": {}, "job_id": JOB}, entry_id=f"{JOB}-q1f2e3d4c"),
        entry(kwargs={"spec": {}, "job_id": JOB}, entry_id=f"{JOB}-p1"),
        entry(kwargs={"spec": {"as": {"deep": {"as": {"four": 1}}}}}),
    ],
)
def test_what_trainq_itself_enqueues_keeps_the_contract(ok: QueueEntry) -> None:
    assert contract_violation(ok) is None


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (entry("os.system", ["touch /x"]), "not 'os.system'"),
        (entry("worker.tasks.train.__globals__"), "only worker.tasks.train"),
        (entry(args=[{"epochs": 1}]), "positional arguments"),
        (entry(callbacks=("os.system",)), "callbacks are refused"),
        (entry(webhooks=1), "webhooks are refused"),
        (entry(dependencies=(JOB,)), "dependencies are refused"),
        (entry(retries=3), "retries"),
        (entry(repeats=3), "repeats"),
        (entry(kwargs=[]), "keywords must be a JSON object"),
        (entry(kwargs={}), "spec= is missing"),
        (entry(kwargs={"spec": {}, "cwd": "/"}), "unknown keywords ['cwd']"),
        (entry(kwargs={"spec": [1]}), "spec= must be a JSON object, not an array"),
        (entry(kwargs={"spec": {"a": {"b": {"c": {"d": {}}}}}}), "nests deeper than 4"),
        (entry(kwargs={"spec": {"dataset": "x" * 20_000}}), "at most 16384"),
        (entry(kwargs={"spec": {}, "owner": 7}), "owner= must be a string"),
        (entry(kwargs={"spec": {}, "owner": ""}), "owner= must be a string"),
        (entry(kwargs={"spec": {}, "owner": "o" * 201}), "owner= must be a string"),
        (entry(kwargs={"spec": {}, "via": "cli"}), "via= is 'api' or absent"),
        (entry(entry_id="not-a-uuid"), "is not a UUID"),
        (entry(entry_id=f"{JOB}-a2"), "no job_id= names the job"),
        (entry(entry_id=JOB.upper()), "is not a UUID"),
        (entry(kwargs={"spec": {}, "job_id": "../x"}, entry_id=f"{JOB}-a2"), "job_id= must be"),
        (entry(kwargs={"spec": {}, "job_id": JOB}, entry_id=f"{uuid.uuid4()}-a2"), "must be"),
        (entry(kwargs={"spec": {}, "job_id": JOB}, entry_id=f"{JOB}-A2"), "must be"),
        (entry(kwargs={"spec": {}, "job_id": JOB}, entry_id=f"{JOB}-{'a' * 17}"), "must be"),
    ],
)
def test_everything_else_is_refused_with_a_reason(bad: QueueEntry, reason: str) -> None:
    assert reason in (contract_violation(bad) or "")


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x04\x95pickle",  # not JSON at all
        b'["worker.tasks.train", null, [], {"spec": {"lr": NaN}}]',
        b'{"func": "worker.tasks.train"}',
        b"[" * 20_000,
        b'["worker.tasks.train", null, [], {"spec": {}}, "extra"]',
    ],
)
def test_a_payload_that_is_not_the_json_rq_writes_is_refused(payload: bytes) -> None:
    assert "not RQ's JSON" in (contract_violation(QueueEntry(id=JOB, payload=payload)) or "")


def test_a_payload_is_measured_before_it_is_parsed() -> None:
    huge = QueueEntry(id=JOB, payload=b"[" + b" " * 40_000 + b"]")
    assert "the payload is over 32768 bytes" in (contract_violation(huge) or "")


def test_a_zlib_field_inflates_no_further_than_its_bound() -> None:
    bomb = zlib.compress(b"[" + b" " * (64 << 20), 9)  # 64 MiB in 64 KiB
    assert len(inflate(bomb, MAX_PAYLOAD_BYTES)) == MAX_PAYLOAD_BYTES + 1
    payload = JSONSerializer.dumps((TASK, None, [], {"spec": {}}))
    assert inflate(zlib.compress(payload), MAX_PAYLOAD_BYTES) == payload


def test_a_field_that_is_not_zlib_is_read_as_it_is_as_rq_does() -> None:
    assert inflate(b'["worker.tasks.train"]', MAX_PAYLOAD_BYTES) == b'["worker.tasks.train"]'
