"""The local API key: made once for a laptop set-up, readable by its owner only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_or_create_key(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "tq_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
