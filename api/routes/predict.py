"""POST /jobs/{id}/predict: classify images with a job's TorchScript model.

Two ways in, one way out:

- `application/json`: `{"images": [...]}`, each image an H×W (grayscale) or C×H×W array of
  numbers in [0, 1], the shape the model was trained on (from the job's run record);
- `multipart/form-data`: PNG or JPEG files in the field `files`, converted to the model's
  channels, resized to its H×W and scaled to [0, 1].

MNIST is white digits on black; `invert=true` (query or form field) takes dark-on-light
images. The model comes from the job's own stored artifact, sha256-checked before it is
loaded, and stays in a small per-process LRU cache keyed by that sha256.

torch (and torchvision, through core.train.export) is imported on the first prediction, not
with the API: it adds seconds and hundreds of MB to a process that otherwise never needs it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from PIL import Image, ImageOps
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.auth import Caller
from api.deps import CallerDep, ReaderDep
from api.routes.jobs import ERRORS, JobId, visible_job
from api.schemas import Problem
from core.db import Artifact
from core.spec import JobStatus
from core.store import get_artifact

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainq.api.predict")
router = APIRouter(prefix="/jobs", tags=["predict"])

MAX_IMAGES = 256  # per JSON request, for inputs of up to 3×64×64
MAX_JSON_VALUES = MAX_IMAGES * 3 * 64 * 64  # numbers per JSON request: larger inputs, fewer images
MAX_FILES = 32  # per multipart request
MAX_FILE_BYTES = 1 << 20  # per file
MAX_SIDE = 4096  # pixels, either side of an uploaded image, checked before decoding it
JSON_BYTES_PER_VALUE = 24  # "0.0039215688593685627, " is 23: full-precision floats fit
BODY_SLACK = 64 << 10  # multipart headers and boundaries, JSON brackets
MAX_MULTIPART_BYTES = MAX_FILES * MAX_FILE_BYTES + BODY_SLACK
MODEL_CACHE_SIZE = 8
MAX_ERRORS = 20  # 422 details listed; a request of 256 bad images does not get 200k lines


def json_images_allowed(shape: tuple[int, int, int]) -> int:
    """Images per JSON request for a model of this input shape: 256, fewer past 3×64×64 (a
    data set's images are at most 3×256×256: 16 of them)."""
    c, h, w = shape
    return min(MAX_IMAGES, MAX_JSON_VALUES // (c * h * w))


def max_json_bytes(shape: tuple[int, int, int]) -> int:
    c, h, w = shape
    return json_images_allowed(shape) * c * h * w * JSON_BYTES_PER_VALUE + BODY_SLACK


# What this route must be allowed to receive (the app-wide body limit must let it through);
# the route enforces its own, tighter, limits while it reads the body, chunked or not.
MAX_BODY_BYTES = max(MAX_MULTIPART_BYTES, MAX_JSON_VALUES * JSON_BYTES_PER_VALUE + BODY_SLACK)


# ---------------------------------------------------------------------------- the contract

Pixel = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Plane = list[list[Pixel]]


def _rank(value: Any) -> str:
    """Tag an image as H×W or C×H×W by its nesting, so that errors name one shape only."""
    if (
        isinstance(value, list)
        and value
        and isinstance(value[0], list)
        and value[0]
        and isinstance(value[0][0], list)
    ):
        return "CxHxW"
    return "HxW"


_TAGS = ("HxW", "CxHxW")
ImageArray = Annotated[
    Annotated[Plane, Tag("HxW")] | Annotated[list[Plane], Tag("CxHxW")],
    Discriminator(_rank),
]


class PredictRequest(BaseModel):
    """Images as numbers in [0, 1]: MNIST-style white on black unless `invert=true`. The
    contract, for the OpenAPI page: _images_from_json enforces it without this model, so
    that a body's memory stays bounded by its images (and its errors by MAX_ERRORS)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    images: list[ImageArray] = Field(
        min_length=1,
        max_length=MAX_IMAGES,
        description=f"1 to {MAX_IMAGES} images, each H×W (one channel) or C×H×W, in the "
        "shape the model was trained on (the run record's `dataset.image_shape`, e.g. "
        f"1×28×28), values in [0, 1]; no NaN or Infinity. At most {MAX_JSON_VALUES} numbers "
        "in all: fewer images for inputs over 3×64×64.",
    )


class Prediction(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    class_: int = Field(alias="class", description="The most probable class.")
    probabilities: list[float] = Field(description="Softmax over the classes; sums to 1.")


class PredictOut(BaseModel):
    predictions: list[Prediction] = Field(description="One per image, in the order sent.")
    model_sha256: str = Field(description="The model that answered (its ETag at /model).")


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
            "resized to its H×W.",
        },
        "invert": {
            "type": "boolean",
            "default": False,
            "description": "Dark-on-light images (same as the query parameter).",
        },
    },
}


# ---------------------------------------------------------------------------- the route


@dataclass(frozen=True)
class _Target:
    job_id: str
    shape: tuple[int, int, int]  # C, H, W
    sha256: str


@router.post(
    "/{job_id}/predict",
    response_model=PredictOut,
    max_body_size=MAX_BODY_BYTES,  # above the app's 1 MiB: up to 32 files, 256 RGB 64×64 arrays
    responses={
        **ERRORS,
        409: {"model": Problem, "description": "The job has not succeeded (yet)."},
        413: {"model": Problem, "description": "Body or a file over its size limit."},
        415: {"model": Problem, "description": "Neither JSON nor multipart/form-data."},
        422: {"description": "Invalid images; `detail[].loc` names the image or file."},
        500: {"model": Problem, "description": "The stored model failed its sha256 check."},
    },
    summary="Classify images with the job's model",
    description='Send JSON `{"images": [...]}` (H×W or C×H×W arrays in [0, 1], at most '
    f"{MAX_IMAGES}, fewer past 3×64×64) or multipart PNG/JPEG `files` (at most {MAX_FILES}, "
    "1 MiB each). "
    "White on black, as MNIST; `invert=true` for dark-on-light images. Returns each "
    "image's class and probabilities, and the sha256 of the model that answered.",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _JSON_SCHEMA},
                "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
            },
        }
    },
)
async def predict(
    job_id: JobId,
    request: Request,
    caller: CallerDep,
    session: ReaderDep,
    invert: Annotated[
        bool, Query(description="Dark-on-light images: use 1 - x (the form field works too).")
    ] = False,
) -> PredictOut:
    # The job first: an unknown job or one without a model is answered before reading
    # (up to 32 MiB of) body. Blocking work (database, decoding, torch) runs in the
    # threadpool, never on the event loop.
    target = await run_in_threadpool(_target, session, caller, job_id)
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type == "application/json":
        cap = max_json_bytes(target.shape)
        body = await _CappedRequest(request, cap, _json_too_large(target.shape)).body()
        images = await run_in_threadpool(_images_from_json, body, target.shape, invert)
    elif media_type == "multipart/form-data":
        files, form_invert = await _read_files(request)
        try:
            images = await run_in_threadpool(
                _images_from_files, files, target.shape, invert or form_invert
            )
        finally:
            for f in files:
                await f.close()
    else:
        raise HTTPException(
            415,
            detail=f'send application/json ({{"images": [...]}}) or multipart/form-data '
            f"(PNG or JPEG files in field 'files'), not {media_type or 'no Content-Type'}",
        )
    return await run_in_threadpool(_predict, session, target, images)


def _target(session: Session, caller: Caller, job_id: uuid.UUID) -> _Target:
    try:
        job = visible_job(session, caller, job_id)
        if job.status != JobStatus.succeeded:
            raise HTTPException(409, detail=f"job {job.id} is {job.status}: no model yet")
        sha = session.scalar(select(Artifact.sha256).where(Artifact.job_id == job.id))
        if sha is None:
            raise HTTPException(409, detail=f"job {job.id} has no stored model")
        return _Target(job_id=job.id, shape=_input_shape(job.id, job.record), sha256=sha)
    finally:
        # End the transaction now: on SQLite it is BEGIN IMMEDIATE, a write lock that
        # must not be held while a client uploads its images.
        session.rollback()


def _input_shape(job_id: str, record: dict[str, Any] | None) -> tuple[int, int, int]:
    shape = ((record or {}).get("dataset") or {}).get("image_shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
    ):
        raise HTTPException(
            500, detail=f"job {job_id}: its run record has no dataset.image_shape [C, H, W]"
        )
    c, h, w = shape
    return c, h, w


# ---------------------------------------------------------------------------- the body


class _CappedRequest(Request):
    """The same request, but its body stream stops with a 413 past `cap` bytes: the
    Content-Length header is checked first, a chunked body as it arrives."""

    def __init__(self, request: Request, cap: int, detail: str) -> None:
        super().__init__(request.scope, request.receive)
        self._cap = cap
        self._detail = detail

    async def stream(self) -> AsyncGenerator[bytes, None]:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._cap:
            raise HTTPException(413, detail=self._detail)
        size = 0
        async for chunk in super().stream():
            size += len(chunk)
            if size > self._cap:
                raise HTTPException(413, detail=self._detail)
            yield chunk


def _json_too_large(shape: tuple[int, int, int]) -> str:
    c, h, w = shape
    return (
        f"JSON body over {max_json_bytes(shape)} bytes ({json_images_allowed(shape)} images of "
        f"{c}×{h}×{w} values at {JSON_BYTES_PER_VALUE} bytes each): send fewer images, shorter "
        "numbers, or PNG files"
    )


_BOOL = TypeAdapter(bool)


async def _read_files(request: Request) -> tuple[list[UploadFile], bool]:
    """The uploaded files (open: the caller closes them) and the form's `invert`."""
    capped = _CappedRequest(
        request,
        MAX_MULTIPART_BYTES,
        f"multipart body over {MAX_MULTIPART_BYTES} bytes: at most {MAX_FILES} files of "
        f"{MAX_FILE_BYTES} bytes (1 MiB) each",
    )
    try:
        form = await capped.form(max_files=MAX_FILES, max_fields=8, max_part_size=1024)
    except StarletteHTTPException as e:
        if e.status_code != 400:
            raise
        # Starlette's 400s for multipart (too many files, malformed body, ...).
        too_many = "Too many files" in str(e.detail)
        raise _invalid(
            [
                {
                    "type": "too_many_files" if too_many else "multipart",
                    "loc": ("body", "files") if too_many else ("body",),
                    "msg": f"at most {MAX_FILES} files per request" if too_many else e.detail,
                }
            ]
        ) from e
    files: list[UploadFile] = []
    errors: list[dict[str, Any]] = []
    invert = False
    for key, value in form.multi_items():
        if key == "files":
            if isinstance(value, UploadFile):
                files.append(value)
            else:
                errors.append(
                    {"type": "not_a_file", "loc": ("body", "files"), "msg": "must be a file"}
                )
        elif key == "invert" and isinstance(value, str):
            try:
                invert = _BOOL.validate_python(value)
            except ValidationError as e:
                errors += [{**err, "loc": ("body", "invert")} for err in _errors(e)]
        else:
            errors.append(
                {
                    "type": "unknown_field",
                    "loc": ("body", key),
                    "msg": "unknown form field: send images in 'files' (and 'invert')",
                }
            )
    if not files and not errors:
        errors.append(
            {
                "type": "missing",
                "loc": ("body", "files"),
                "msg": "send at least one PNG or JPEG file in field 'files'",
            }
        )
    if errors:
        await form.close()
        raise _invalid(errors)
    return files, invert


def _invalid(errors: Sequence[dict[str, Any]]) -> RequestValidationError:
    """A 422 in the app's usual shape (`detail[].loc`, `msg`, `type`)."""
    return RequestValidationError(list(errors[:MAX_ERRORS]))


def _errors(e: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's errors without the union tags in `loc` and without large inputs (a
    too_long error would echo the whole request back)."""
    out = []
    for err in e.errors(include_url=False)[:MAX_ERRORS]:
        item: dict[str, Any] = {
            "type": err["type"],
            "loc": tuple(p for p in err["loc"] if p not in _TAGS),
            "msg": err["msg"],
        }
        value = err.get("input")
        if (
            value is None
            or isinstance(value, bool | int | float)
            or (isinstance(value, str) and len(value) <= 100)
        ):
            item["input"] = value
        out.append(item)
    return out


def _images_from_json(body: bytes, shape: tuple[int, int, int], invert: bool) -> torch.Tensor:
    """`{"images": [...]}` as an (N, C, H, W) tensor, or a 422 naming the first few
    problems. The body is counted before it is parsed, so that what it parses into is
    bounded by what the allowed images need, and every check stops at MAX_ERRORS problems:
    a request of 200,000 bad numbers costs no more than a good one."""
    import torch

    allowed = json_images_allowed(shape)
    _check_json_counts(body, shape, allowed)
    _check_json_keys(body)
    images = _json_images(body, allowed, shape)
    planes, errors = _stacked(images, shape)
    if errors:
        raise _invalid(errors)
    x = torch.tensor(planes, dtype=torch.float32)
    # NaN fails both comparisons, so it is caught with the values outside [0, 1].
    outside = ~((x >= 0) & (x <= 1))
    if outside.any():
        raise _invalid(
            [
                _value_error(images, planes, tuple(i))
                for i in outside.nonzero()[:MAX_ERRORS].tolist()
            ]
        )
    return 1 - x if invert else x


def _check_json_counts(body: bytes, shape: tuple[int, int, int], allowed: int) -> None:
    """413 for a body that holds more arrays, objects or values than one image more than
    `allowed` can (one more, so that one too many is a 422 that says so): short numbers,
    empty arrays and deep nesting would otherwise parse into many times the images' size."""
    c, h, w = shape
    n = allowed + 1
    containers = 2 + n * (1 + c + c * h)  # the object, `images`, each image, plane and row
    values = n * c * h * w
    if body.count(b"[") + body.count(b"{") > containers or body.count(b",") > containers + values:
        raise HTTPException(
            413,
            detail=f"the JSON body holds more arrays or values than {allowed} images of "
            f"{c}×{h}×{w} do: send fewer images, or PNG files",
        )


def _check_json_keys(body: bytes) -> None:
    """One 422 for a body with more keys than MAX_ERRORS, before it is parsed: a valid body
    has one colon (after "images") and no other string, so every further colon is an
    extra key or a string, each of which would cost an object when parsed, and an error."""
    keys = body.count(b":")
    if keys > MAX_ERRORS:
        raise _invalid(
            [
                _problem(
                    "extra_forbidden",
                    ("body",),
                    f"the body holds {keys} keys (':'): send one object with the one key "
                    '"images", a list of arrays of numbers',
                )
            ]
        )


def _json_images(body: bytes, allowed: int, shape: tuple[int, int, int]) -> list[Any]:
    """The body's `images` list, checked as PredictRequest describes it (an object with
    that one key, a list of 1 to `allowed` images)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, huge integers
        raise _invalid([_problem("json_invalid", ("body",), f"Invalid JSON: {e}")]) from e
    if not isinstance(doc, dict):
        raise _invalid([_problem("model_type", ("body",), 'send an object: {"images": [...]}')])
    errors = [
        _problem("extra_forbidden", ("body", key), "Extra inputs are not permitted")
        for key in doc
        if key != "images"
    ]
    images = doc.get("images")
    c, h, w = shape
    if "images" not in doc:
        errors.append(_problem("missing", ("body", "images"), "Field required"))
    elif not isinstance(images, list):
        errors.append(_problem("list_type", ("body", "images"), "Input should be a valid list"))
    elif not 1 <= len(images) <= allowed:
        errors.append(
            _problem(
                "too_short" if not images else "too_long",
                ("body", "images"),
                f"send 1 to {allowed} images of {c}×{h}×{w}, not {len(images)}",
            )
        )
    if errors:
        raise _invalid(errors)
    assert isinstance(images, list)
    return images


def _stacked(
    images: list[Any], shape: tuple[int, int, int]
) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """Each image as C planes of H rows of W numbers, and the shape problems found (at
    most MAX_ERRORS: the walk stops there)."""
    c, h, w = shape
    want = f"this model takes {c}×{h}×{w} (C×H×W) images" + (
        f", or {h}×{w} (H×W)" if c == 1 else ""
    )
    errors: list[dict[str, Any]] = []
    stacked: list[list[Any]] = []
    for i, image in enumerate(images):
        planes, problem = _planes(image, shape, ("body", "images", i), want)
        if problem is None:
            stacked.append(planes)
            continue
        errors.append(problem)
        if len(errors) >= MAX_ERRORS:
            break
    return stacked, errors


def _planes(
    image: Any, shape: tuple[int, int, int], where: tuple[Any, ...], want: str
) -> tuple[list[Any], dict[str, Any] | None]:
    """An image as its C planes, or the first problem with its shape."""
    c = shape[0]
    if not isinstance(image, list):
        return [], _problem("list_type", where, f"not an array; {want}")
    if _rank(image) == "HxW":
        if c != 1:
            return [], _shape_error(where, f"an H×W image has one channel; {want}")
        planes, places = [image], [where]
    elif len(image) != c:
        return [], _shape_error(where, f"{len(image)} channels; {want}")
    else:
        planes, places = image, [(*where, ch) for ch in range(c)]
    for plane, place in zip(planes, places, strict=True):
        problem = _plane_problem(plane, shape, place, want)
        if problem is not None:
            return [], problem
    return planes, None


_NUMBERS = frozenset({int, float})  # not bool: JSON true is not a pixel


def _plane_problem(
    plane: Any, shape: tuple[int, int, int], where: tuple[Any, ...], want: str
) -> dict[str, Any] | None:
    _, h, w = shape
    if not isinstance(plane, list) or len(plane) != h:
        return _shape_error(where, f"{len(plane) if isinstance(plane, list) else 0} rows; {want}")
    for r, row in enumerate(plane):
        if not isinstance(row, list) or len(row) != w:
            n = len(row) if isinstance(row, list) else 0
            return _shape_error((*where, r), f"{n} values in this row; {want}")
        if not _NUMBERS.issuperset(map(type, row)):
            col = next(k for k, v in enumerate(row) if type(v) not in _NUMBERS)
            return _problem("float_type", (*where, r, col), "Input should be a valid number")
    return None


def _value_error(
    images: list[Any], planes: list[list[Any]], index: tuple[int, ...]
) -> dict[str, Any]:
    """The problem with the number at (image, channel, row, column), located as sent."""
    n, ch, r, col = index
    value = planes[n][ch][r][col]
    where = ("body", "images", n, *((ch,) if _rank(images[n]) == "CxHxW" else ()), r, col)
    if isinstance(value, float) and not math.isfinite(value):
        return _problem("finite_number", where, "Input should be a finite number", str(value))
    if value < 0:
        return _problem("greater_than_equal", where, "Input should be greater than or equal to 0")
    return _problem("less_than_equal", where, "Input should be less than or equal to 1")


def _problem(kind: str, loc: tuple[Any, ...], msg: str, value: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg}
    if value is not None:
        out["input"] = value
    return out


def _shape_error(loc: tuple[Any, ...], msg: str) -> dict[str, Any]:
    return _problem("shape_mismatch", loc, msg)


# ---------------------------------------------------------------------------- files


def _images_from_files(
    files: list[UploadFile], shape: tuple[int, int, int], invert: bool
) -> torch.Tensor:
    import torch

    c, h, w = shape
    if c not in (1, 3):
        raise HTTPException(
            422, detail=f"this model takes {c}-channel images: send them as JSON arrays"
        )
    errors: list[dict[str, Any]] = []
    decoded: list[bytes] = []
    for i, f in enumerate(files):
        name = f.filename or f"files[{i}]"
        if f.size is not None and f.size > MAX_FILE_BYTES:
            raise HTTPException(
                413,
                detail=f"file {name!r} (files[{i}]) is {f.size} bytes: at most "
                f"{MAX_FILE_BYTES} (1 MiB) per file",
            )
        try:
            decoded.append(decode_image(f.file, (c, h, w), invert))
        except ImageRejected as e:
            errors.append(
                {"type": "invalid_image", "loc": ("body", "files", i), "msg": f"{name!r}: {e}"}
            )
    if errors:
        raise _invalid(errors)
    raw = torch.frombuffer(bytearray(b"".join(decoded)), dtype=torch.uint8)
    # Pillow's bytes are H, W, C (interleaved RGB); the model takes C, H, W.
    return raw.reshape(len(decoded), h, w, c).permute(0, 3, 1, 2).float().div(255)


class ImageRejected(ValueError):
    """An upload that is not a usable PNG or JPEG; the message says why."""


def decode_image(data: IO[bytes], shape: tuple[int, int, int], invert: bool) -> bytes:
    """A PNG or JPEG as the model's input: `H*W*C` bytes (C = 1: "L", 3: "RGB"), H, W, C
    order, white on black. Transparent pixels take the background's colour (black, or white
    when `invert`); 16-bit grayscale is scaled, not clipped. The size is checked from the
    header, before any pixel is decoded."""
    c, h, w = shape
    mode = "L" if c == 1 else "RGB"
    try:
        # Image.open reads the header only. Its own bomb check (a warning past ~89 MP, an
        # error past ~179 MP) comes before ours; ours refuses far below that. No
        # warnings.catch_warnings here: it is not thread-safe, and this runs in a threadpool.
        with Image.open(data, formats=("PNG", "JPEG")) as img:
            width, height = img.size
            if width > MAX_SIDE or height > MAX_SIDE or width < 1 or height < 1:
                raise ImageRejected(f"is {width}×{height} pixels: at most {MAX_SIDE}×{MAX_SIDE}")
            img.draft(mode, (w, h))  # JPEG: decode at a reduced scale; PNG: no-op
            out = _to_mode(img, mode, invert)
            if out.size != (w, h):
                out = out.resize((w, h), Image.Resampling.BILINEAR, reducing_gap=3.0)
            if invert:
                out = ImageOps.invert(out)
            return out.tobytes()
    except ImageRejected:
        raise
    except Image.UnidentifiedImageError as e:
        raise ImageRejected("not a PNG or JPEG image") from e
    except Image.DecompressionBombError as e:
        raise ImageRejected(f"too many pixels ({e})") from e
    except Exception as e:  # Pillow raises many kinds on a corrupt file; none is a 500
        raise ImageRejected(f"could not be decoded ({type(e).__name__}: {e})") from e


def _to_mode(img: Image.Image, mode: str, invert: bool) -> Image.Image:
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        background = Image.new(
            "RGBA", rgba.size, (255, 255, 255, 255) if invert else (0, 0, 0, 255)
        )
        background.alpha_composite(rgba)
        return background.convert(mode)
    if img.mode.startswith("I;16") or img.mode == "I":
        # 16-bit grayscale PNG: convert("L") would clip everything above 255 to white.
        img = img.convert("I").point(lambda v: v / 257)
    return img.convert(mode)


# ---------------------------------------------------------------------------- the model


class ModelCache:
    """The last `size` models used, keyed by their artifact's sha256. Thread-safe: routes
    run in the threadpool. Loading happens outside the lock (two threads may both load a
    model the first time; one copy stays)."""

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

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._models)


models = ModelCache(MODEL_CACHE_SIZE)


def _model(session: Session, target: _Target) -> tuple[Any, str]:
    """The job's TorchScript model, from the cache or from its artifact in our database,
    loaded only if the bytes match their stored sha256."""
    cached = models.get(target.sha256)
    if cached is not None:
        return cached, target.sha256
    try:
        art = get_artifact(session, job_id=target.job_id)
        if art is None:
            raise HTTPException(409, detail=f"job {target.job_id} has no stored model")
        blob, stored = art.data, art.sha256
    finally:
        session.rollback()
    if hashlib.sha256(blob).hexdigest() != stored:
        log.error("job %s: stored model failed its sha256 check", target.job_id)
        raise HTTPException(
            500, detail=f"job {target.job_id}: the stored model failed its sha256 check"
        )
    from core.train.export import load_torchscript

    try:
        model = load_torchscript(blob)
    except Exception as e:
        log.exception("job %s: stored model does not load", target.job_id)
        raise HTTPException(
            500, detail=f"job {target.job_id}: the stored model does not load as TorchScript"
        ) from e
    models.put(stored, model)
    return model, stored


def _predict(session: Session, target: _Target, images: torch.Tensor) -> PredictOut:
    import torch

    model, sha = _model(session, target)
    with torch.inference_mode():
        logits = model(images)
        if logits.dim() != 2 or logits.shape[0] != images.shape[0]:
            raise HTTPException(
                500, detail=f"job {target.job_id}: the model returned {list(logits.shape)}"
            )
        probs = logits.float().softmax(1)
        classes = probs.argmax(1)
    return PredictOut.model_validate(
        {
            "predictions": [
                {"class": k, "probabilities": p}
                for k, p in zip(classes.tolist(), probs.tolist(), strict=True)
            ],
            "model_sha256": sha,
        }
    )
