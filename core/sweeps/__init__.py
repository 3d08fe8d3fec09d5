"""Sweeps: many trials as one experiment, searched with Optuna over the job queue.
`spec` (the request), `search` (Optuna's samplers and pruners over the stored trials),
`trials` (making, judging, canceling and reporting a sweep's trials).
See docs/sweeps.md."""
