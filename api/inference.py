"""A job's model in the format that answers fastest (api.formats.PREDICT_ORDER), sha256-
checked, cached per process by that sha256, and the classes it gives a batch of images;
torch and onnxruntime are imported on the first prediction. See docs/api.md."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.reads import read
from core.db import Database, allow_time_for
from core.errors import ModelDamaged, NoModel
from core.spec import ExportFormat
from core.store import get_artifact

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainq.api.predict")
MODEL_CACHE_SIZE = 8
# One intra-op thread per onnxruntime run: a request is at most 256 small images, and the
# threadpool already runs concurrent requests side by side; a pool per session would spin
# against torch's and against the other requests' (bench.predict_formats measures this).
ONNX_THREADS = 1


class Prediction(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    class_: int = Field(alias="class", description="The most probable class.")
    probabilities: list[float] = Field(description="Softmax over the classes; sums to 1.")


class PredictOut(BaseModel):
    predictions: list[Prediction] = Field(description="One per image, in the order sent.")
    model_format: ExportFormat = Field(description="The format of the model that answered.")
    model_sha256: str = Field(
        description="The model that answered: its ETag at /model?format=<model_format>."
    )


class ModelCache:
    """The last `size` models used, keyed by their artifact's sha256. Thread-safe: models
    are loaded in the threadpool. Loading happens outside the lock (two threads may both
    load a model the first time; one copy stays)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._models: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sha256: str) -> Any | None:
        with self._lock:
            model = self._models.get(sha256)
            if model is not None:
                self._models.move_to_end(sha256)
            return model

    def put(self, sha256: str, model: Any) -> None:
        with self._lock:
            self._models[sha256] = model
            self._models.move_to_end(sha256)
            while len(self._models) > self.size:
                self._models.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._models)


models = ModelCache(MODEL_CACHE_SIZE)


async def classify(
    db: Database, job_id: str, fmt: ExportFormat, sha256: str, images: torch.Tensor
) -> PredictOut:
    """The job's model in `fmt` (the one whose artifact has this sha256) applied to
    `images`."""
    model, sha = models.get(sha256), sha256
    if model is None:
        blob, sha = await read(db, _stored_model, job_id, fmt)
        model = await run_in_threadpool(_load, job_id, fmt, blob, sha)
    return await run_in_threadpool(_run_model, model, job_id, fmt, sha, images)


def _stored_model(session: Session, job_id: str, fmt: ExportFormat) -> tuple[bytes, str]:
    """The artifact's bytes and the sha256 stored with them."""
    art = get_artifact(session, job_id=job_id, format=fmt)
    if art is None:
        raise NoModel(f"job {job_id} has no stored {fmt} model")
    allow_time_for(session, art.size)
    return art.data, art.sha256


def _load(job_id: str, fmt: ExportFormat, blob: bytes, sha256: str) -> Any:
    """The model in `blob`, loaded (and cached) only if its bytes match their stored
    sha256."""
    if hashlib.sha256(blob).hexdigest() != sha256:
        log.error("job %s: stored %s model failed its sha256 check", job_id, fmt)
        raise ModelDamaged(f"job {job_id}: the stored model failed its sha256 check")
    from core.train.verify_export import load_model

    try:
        model = load_model(fmt, blob, threads=ONNX_THREADS)
    except Exception as e:
        log.exception("job %s: stored %s model does not load", job_id, fmt)
        raise ModelDamaged(f"job {job_id}: the stored model does not load as {fmt}") from e
    models.put(sha256, model)
    return model


def _run_model(
    model: Any, job_id: str, fmt: ExportFormat, sha256: str, images: torch.Tensor
) -> PredictOut:
    import torch

    with torch.inference_mode():
        logits = model(images)
        if logits.dim() != 2 or logits.shape[0] != images.shape[0]:
            raise ModelDamaged(f"job {job_id}: the model returned {list(logits.shape)}")
        probs = logits.float().softmax(1)
        classes = probs.argmax(1)
    return PredictOut.model_validate(
        {
            "predictions": [
                {"class": k, "probabilities": p}
                for k, p in zip(classes.tolist(), probs.tolist(), strict=True)
            ],
            "model_format": fmt,
            "model_sha256": sha256,
        }
    )
