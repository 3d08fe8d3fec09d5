"""Which trainq a process runs: its package's version, its JobSpec (core.spec.SPEC_VERSION)
and the schema revision its migrations end at. Workers write them into their RQ
registration; the admin's /health and the launcher compare them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from core.schema import head_revision
from core.spec import SPEC_VERSION

FIELDS = ("trainq_version", "spec_version", "schema_revision")  # in a worker's registration


@dataclass(frozen=True)
class Versions:
    trainq: str
    spec: str
    schema: str | None  # the migrations' head this code knows

    def fields(self) -> dict[str, str]:
        """As a worker's registration holds them (RQ's worker hash)."""
        return {"trainq_version": self.trainq, "spec_version": self.spec} | (
            {"schema_revision": self.schema} if self.schema else {}
        )

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Versions | None:
        """A registration's versions; None for one written by a trainq that wrote none."""
        if "trainq_version" not in fields or "spec_version" not in fields:
            return None
        return cls(fields["trainq_version"], fields["spec_version"], fields.get("schema_revision"))


@functools.cache
def running_versions() -> Versions:
    try:
        package = version("trainq")
    except PackageNotFoundError:  # run from a source tree that was never installed
        package = "unknown"
    return Versions(package, SPEC_VERSION, head_revision())
