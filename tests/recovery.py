"""For cases that break a running service: timings shortened so that recovery takes seconds
(a job is lost after 4 s without a heartbeat and workers reconcile every second, where the
defaults are 30 s and 10 s), and a job long enough to break mid-way."""

from __future__ import annotations

FAST_RECOVERY = {
    "TRAINQ_HEARTBEAT_TIMEOUT_S": "4",
    "TRAINQ_RECONCILE_INTERVAL_S": "1",
    "TRAINQ_QUEUE_GRACE_S": "2",
}
SPEC = {"epochs": 3, "batch_size": 128, "seed": 5}  # 32 steps an epoch, ~4 s an epoch here
STEPS = 3 * 32
