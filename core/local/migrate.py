"""Running the Alembic migrations (an explicit step: `trainq migrate`, or `trainq up`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations

MIGRATIONS = Path(migrations.__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), revision)
