"""POST /jobs/{id}/predict: classify images with a job's model, sent as JSON arrays or as
PNG/JPEG files. The work is in api.services.predict and api.inference. See docs/api.md."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from api.body import BODY_SLACK
from api.deps import CallerDep, DatabaseDep, ParsersDep
from api.image_files import MAX_FILES, MAX_MULTIPART_BYTES
from api.images import MAX_SIDE
from api.inference import DEFAULT_TOP_K, Answer, PredictOut, classify
from api.json_images import JSON_BYTES_PER_VALUE, MAX_IMAGES, MAX_JSON_VALUES, PredictRequest
from api.reads import read
from api.responses import problem
from api.routes.jobs import ERRORS, JobId
from api.services.predict import read_images, target

router = APIRouter(prefix="/jobs", tags=["predict"])

# What this route must be allowed to receive (the app-wide body limit must let it through);
# the route enforces its own, tighter, limits while it reads the body, chunked or not.
MAX_BODY_BYTES = max(MAX_MULTIPART_BYTES, MAX_JSON_VALUES * JSON_BYTES_PER_VALUE + BODY_SLACK)

_JSON_SCHEMA = PredictRequest.model_json_schema()
assert "$defs" not in _JSON_SCHEMA  # inlined into the OpenAPI operation below
_MULTIPART_SCHEMA = {
    "type": "object",
    "required": ["files"],
    "properties": {
        "files": {
            "type": "array",
            "items": {"type": "string", "format": "binary"},
            "maxItems": MAX_FILES,
            "description": f"1 to {MAX_FILES} PNG or JPEG files of at most 1 MiB and "
            f"{MAX_SIDE}×{MAX_SIDE} pixels each; converted to the model's channels and "
            "made as its data set's images were: by the set's pad or crop fit, else "
            "resized to its H×W (reduced as they are decoded).",
        },
        "invert": {
            "type": "boolean",
            "default": False,
            "description": "Dark-on-light images (same as the query parameter).",
        },
    },
}


Invert = Annotated[
    bool, Query(description="Dark-on-light images: use 1 - x (the form field works too).")
]
TopK = Annotated[
    int | None,
    Query(
        ge=1,
        le=1000,
        description=f"How many of the most probable classes to name per image; default "
        f"{DEFAULT_TOP_K}, or every class where there are fewer.",
    ),
]

PREDICT_RESPONSES = {
    **ERRORS,
    409: problem("The job has not succeeded (yet)."),
    413: problem("Body or a file over its size limit."),
    415: problem("Neither JSON nor multipart/form-data."),
    422: {"description": "Invalid images; `detail[].loc` names the image or file."},
    500: problem("The stored model failed its sha256 check."),
    503: problem(
        "This API process is decoding all the images its budget allows "
        "(max_decode_bytes) and none gave back enough within 5 s; see Retry-After."
    ),
}
PREDICT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _JSON_SCHEMA},
            "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
        },
    }
}


@router.post(
    "/{job_id}/predict",
    response_model=PredictOut,
    max_body_size=MAX_BODY_BYTES,  # above the app's 1 MiB: up to 32 files, 256 RGB 64×64 arrays
    responses=PREDICT_RESPONSES,
    summary="Classify images with the job's model",
    description='Send JSON `{"images": [...]}` (H×W or C×H×W arrays in [0, 1], at most '
    f"{MAX_IMAGES}, fewer past 3×64×64) or multipart PNG/JPEG `files` (at most {MAX_FILES}, "
    "1 MiB each). "
    "White on black, as MNIST; `invert=true` for dark-on-light images. Returns each "
    "image's class, its name (`label`), the `k` most probable classes by name with their "
    "probabilities (`top`) and every class's probability, and the format and sha256 of the "
    "model that answered: ONNX (on onnxruntime) when the job offers it, else TorchScript, "
    "else pt2.",
    openapi_extra=PREDICT_BODY,
)
async def predict(
    job_id: JobId,
    request: Request,
    db: DatabaseDep,
    parsers: ParsersDep,
    caller: CallerDep,
    invert: Invert = False,
    k: TopK = None,
) -> PredictOut:
    # The job first: an unknown job or one without a model is answered before any of the
    # body (up to MAX_BODY_BYTES) is read, and the read's session is closed by then: no
    # database connection is held while a client uploads its images.
    model = await read(db, target, caller, job_id)
    images = await read_images(
        request, model.shape, invert, parsers.for_key(caller.owner), model.fit
    )
    answer = Answer(classes=model.classes, k=k)
    return await classify(db, model.job_id, model.format, model.sha256, images, answer)
