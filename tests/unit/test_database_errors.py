"""What the API answers when the database refuses a write: a full disk is a 507 that says so
(a retry cannot help until space is freed), anything else a 503 to retry."""

from __future__ import annotations

import json
import sqlite3

from sqlalchemy.exc import OperationalError

from api.errors import database_problem


def _answer(orig: Exception) -> tuple[int, str, str | None]:
    response = database_problem(OperationalError("INSERT INTO datasets ...", {}, orig))
    detail = json.loads(bytes(response.body))["detail"]
    return response.status_code, detail, response.headers.get("Retry-After")


def test_a_full_disk_is_507_and_says_so() -> None:
    status, detail, retry = _answer(sqlite3.OperationalError("database or disk is full"))
    assert status == 507 and "disk is full" in detail and retry is None


def test_a_busy_database_is_503_to_retry() -> None:
    status, detail, retry = _answer(sqlite3.OperationalError("database is locked"))
    assert status == 503 and "retry" in detail and retry is not None
