"""A job's model in the format that answers fastest (api.formats.PREDICT_ORDER), sha256-
checked, cached per process by that sha256, and the classes it gives a batch of images;
torch and onnxruntime are imported on the first prediction. See docs/api.md."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
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


DEFAULT_TOP_K = 5


class Label(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    label: str = Field(description="The class's name (its folder's, or the set's own).")
    class_: int = Field(alias="class", description="The class's number.")
    probability: float


class Prediction(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    class_: int = Field(alias="class", description="The most probable class.")
    label: str = Field(description="The most probable class's name.")
    top: list[Label] = Field(description="The k most probable classes, most probable first.")
    probabilities: list[float] = Field(description="Softmax over the classes; sums to 1.")


class PredictOut(BaseModel):
    predictions: list[Prediction] = Field(description="One per image, in the order sent.")
    classes: list[str] = Field(description="The class names, in class-number order.")
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


@dataclass(frozen=True)
class Answer:
    """How to name what the model returns: its classes' names and how many to list."""

    classes: tuple[str, ...]  # from the job's record; () names the classes by number
    k: int | None  # the top labels per image; None: DEFAULT_TOP_K or all the classes

    def names(self, num_classes: int) -> list[str]:
        if len(self.classes) == num_classes:
            return list(self.classes)
        return [str(c) for c in range(num_classes)]


async def classify(
    db: Database,
    job_id: str,
    fmt: ExportFormat,
    sha256: str,
    images: torch.Tensor,
    answer: Answer | None = None,
) -> PredictOut:
    """The job's model in `fmt` (the one whose artifact has this sha256) applied to
    `images`, its top classes named as `answer` says."""
    model, sha = models.get(sha256), sha256
    if model is None:
        blob, sha = await read(db, _stored_model, job_id, fmt)
        model = await run_in_threadpool(_load, job_id, fmt, blob, sha)
    named = answer or Answer(classes=(), k=None)
    return await run_in_threadpool(_run_model, model, job_id, fmt, sha, images, named)


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
    model: Any,
    job_id: str,
    fmt: ExportFormat,
    sha256: str,
    images: torch.Tensor,
    answer: Answer,
) -> PredictOut:
    import torch

    with torch.inference_mode():
        logits = model(images)
        if logits.dim() != 2 or logits.shape[0] != images.shape[0]:
            raise ModelDamaged(f"job {job_id}: the model returned {list(logits.shape)}")
        probs = logits.float().softmax(1)
        k = min(answer.k or DEFAULT_TOP_K, probs.shape[1])
        top_p, top_c = probs.topk(k, dim=1)  # (N, k), most probable first
    names = answer.names(probs.shape[1])
    return PredictOut.model_validate(
        {
            "predictions": [
                _prediction(cs, ps, p, names)
                for cs, ps, p in zip(top_c.tolist(), top_p.tolist(), probs.tolist(), strict=True)
            ],
            "classes": names,
            "model_format": fmt,
            "model_sha256": sha256,
        }
    )


def _prediction(
    top: list[int], top_p: list[float], probs: list[float], names: list[str]
) -> dict[str, Any]:
    return {
        "class": top[0],
        "label": names[top[0]],
        "top": [
            {"label": names[c], "class": c, "probability": p}
            for c, p in zip(top, top_p, strict=True)
        ],
        "probabilities": probs,
    }
