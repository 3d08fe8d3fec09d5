"""trainq's shared core: the job spec, settings, errors, the trainer and storage."""

import os

# onnxruntime (1.29 and later) records telemetry on POSIX hosts: a database under the home
# folder, opened as it is imported, and uploads. trainq runs users' models on their own
# machines and sends nothing anywhere: off unless the operator set it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
