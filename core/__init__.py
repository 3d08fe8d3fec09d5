"""trainq's shared core: the job spec, settings, errors, the trainer and (later) storage."""
