"""`python -m tests.faults.paused_horse --name N --queue Q`: worker.rq_worker, whose work horse
pauses before the job function starts, so that a test can send SIGTERM in the window
between the fork and the job's own SIGTERM handler (worker.preemption). The horse touches
the file named by PAUSED_HORSE_MARKER once it is in the pause."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import worker.tasks
from worker.rq_worker import main

PAUSE_S = 3.0
train = worker.tasks.train


def paused_train(*args: Any, **kwargs: Any) -> dict[str, Any]:
    Path(os.environ["PAUSED_HORSE_MARKER"]).touch()
    time.sleep(PAUSE_S)
    return train(*args, **kwargs)


if __name__ == "__main__":
    worker.tasks.train = paused_train  # RQ finds the job function by its name, here
    main()
