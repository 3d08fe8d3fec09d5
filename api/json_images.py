"""Images sent to POST /jobs/{id}/predict as JSON (`{"images": [...]}`), counted before
they are parsed so that a bad body costs no more than a good one. See docs/api.md."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from api.body import BODY_SLACK, CappedRequest
from core.errors import TooLarge

if TYPE_CHECKING:
    import torch

MAX_IMAGES = 256  # per JSON request, for inputs of up to 3×64×64
MAX_JSON_VALUES = MAX_IMAGES * 3 * 64 * 64  # numbers per JSON request: larger inputs, fewer images
JSON_BYTES_PER_VALUE = 24  # "0.0039215688593685627, " is 23: full-precision floats fit
MAX_ERRORS = 20  # 422 details listed; a request of 256 bad images does not get 200k lines


def json_images_allowed(shape: tuple[int, int, int]) -> int:
    """Images per JSON request for a model of this input shape: 256, fewer past 3×64×64 (a
    data set's images are at most 3×256×256: 16 of them)."""
    c, h, w = shape
    return min(MAX_IMAGES, MAX_JSON_VALUES // (c * h * w))


def max_json_bytes(shape: tuple[int, int, int]) -> int:
    c, h, w = shape
    return json_images_allowed(shape) * c * h * w * JSON_BYTES_PER_VALUE + BODY_SLACK


def _json_too_large(shape: tuple[int, int, int]) -> str:
    """The 413's detail for a JSON body over max_json_bytes(shape)."""
    c, h, w = shape
    return (
        f"JSON body over {max_json_bytes(shape)} bytes ({json_images_allowed(shape)} images of "
        f"{c}×{h}×{w} values at {JSON_BYTES_PER_VALUE} bytes each): send fewer images, shorter "
        "numbers, or PNG files"
    )


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


ImageArray = Annotated[
    Annotated[Plane, Tag("HxW")] | Annotated[list[Plane], Tag("CxHxW")],
    Discriminator(_rank),
]


class PredictRequest(BaseModel):
    """Images as numbers in [0, 1]: MNIST-style white on black unless `invert=true`. The
    contract, for the OpenAPI page: read_json_images enforces it without this model, so
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


# ---------------------------------------------------------------------------- the checks


async def read_json_images(
    request: Request, shape: tuple[int, int, int], invert: bool
) -> torch.Tensor:
    """The request's images as an (N, C, H, W) tensor; the body is capped by what `shape`'s
    images need. Parsing and checking run in the threadpool, never on the event loop."""
    body = await CappedRequest(request, max_json_bytes(shape), _json_too_large(shape)).body()
    return await run_in_threadpool(_images_from_json, body, shape, invert)


def _images_from_json(body: bytes, shape: tuple[int, int, int], invert: bool) -> torch.Tensor:
    """`{"images": [...]}` as an (N, C, H, W) tensor, or a 422 naming the first few
    problems."""
    import torch

    allowed = json_images_allowed(shape)
    _check_json_counts(body, shape, allowed)
    _check_json_keys(body)
    images = _json_images(body, allowed, shape)
    planes, errors = _stacked(images, shape)
    if errors:
        raise invalid(errors)
    try:
        x = torch.tensor(planes, dtype=torch.float32)
    except OverflowError:  # an integer past a float's range (JSON integers have no bound)
        raise invalid(_huge_integers(images, planes)) from None
    # NaN fails both comparisons, so it is caught with the values outside [0, 1].
    outside = ~((x >= 0) & (x <= 1))
    if outside.any():
        raise invalid(
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
        raise TooLarge(
            f"the JSON body holds more arrays or values than {allowed} images of "
            f"{c}×{h}×{w} do: send fewer images, or PNG files"
        )


def _check_json_keys(body: bytes) -> None:
    """One 422 for a body with more keys than MAX_ERRORS, before it is parsed: a valid body
    has one colon (after "images") and no other string, so every further colon is an
    extra key or a string, each of which would cost an object when parsed, and an error."""
    keys = body.count(b":")
    if keys > MAX_ERRORS:
        raise invalid(
            [
                problem(
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
        raise invalid([problem("json_invalid", ("body",), f"Invalid JSON: {e}")]) from e
    if not isinstance(doc, dict):
        raise invalid([problem("model_type", ("body",), 'send an object: {"images": [...]}')])
    errors = [
        problem("extra_forbidden", ("body", key), "Extra inputs are not permitted")
        for key in doc
        if key != "images"
    ]
    images = doc.get("images")
    c, h, w = shape
    if "images" not in doc:
        errors.append(problem("missing", ("body", "images"), "Field required"))
    elif not isinstance(images, list):
        errors.append(problem("list_type", ("body", "images"), "Input should be a valid list"))
    elif not 1 <= len(images) <= allowed:
        errors.append(
            problem(
                "too_short" if not images else "too_long",
                ("body", "images"),
                f"send 1 to {allowed} images of {c}×{h}×{w}, not {len(images)}",
            )
        )
    if errors:
        raise invalid(errors)
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
        planes, found = _planes(image, shape, ("body", "images", i), want)
        if found is None:
            stacked.append(planes)
            continue
        errors.append(found)
        if len(errors) >= MAX_ERRORS:
            break
    return stacked, errors


def _planes(
    image: Any, shape: tuple[int, int, int], where: tuple[Any, ...], want: str
) -> tuple[list[Any], dict[str, Any] | None]:
    """An image as its C planes, or the first problem with its shape."""
    c = shape[0]
    if not isinstance(image, list):
        return [], problem("list_type", where, f"not an array; {want}")
    if _rank(image) == "HxW":
        if c != 1:
            return [], _shape_error(where, f"an H×W image has one channel; {want}")
        planes, places = [image], [where]
    elif len(image) != c:
        return [], _shape_error(where, f"{len(image)} channels; {want}")
    else:
        planes, places = image, [(*where, ch) for ch in range(c)]
    for plane, place in zip(planes, places, strict=True):
        wrong = _plane_problem(plane, shape, place, want)
        if wrong is not None:
            return [], wrong
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
            return problem("float_type", (*where, r, col), "Input should be a valid number")
    return None


def _huge_integers(images: list[Any], planes: list[list[Any]]) -> list[dict[str, Any]]:
    """The problems with the integers outside [0, 1], the first MAX_ERRORS of them: found
    only once the tensor could not hold them, so that valid bodies pay no walk for it."""
    found = (
        _value_error(images, planes, (n, ch, r, col))
        for n, image in enumerate(planes)
        for ch, plane in enumerate(image)
        for r, row in enumerate(plane)
        for col, v in enumerate(row)
        if type(v) is int and not 0 <= v <= 1
    )
    return list(itertools.islice(found, MAX_ERRORS))


def _value_error(
    images: list[Any], planes: list[list[Any]], index: tuple[int, ...]
) -> dict[str, Any]:
    """The problem with the number at (image, channel, row, column), located as sent."""
    n, ch, r, col = index
    value = planes[n][ch][r][col]
    where = ("body", "images", n, *((ch,) if _rank(images[n]) == "CxHxW" else ()), r, col)
    if isinstance(value, float) and not math.isfinite(value):
        return problem("finite_number", where, "Input should be a finite number", str(value))
    if value < 0:
        return problem("greater_than_equal", where, "Input should be greater than or equal to 0")
    return problem("less_than_equal", where, "Input should be less than or equal to 1")


def invalid(errors: Sequence[dict[str, Any]]) -> RequestValidationError:
    """A 422 in the app's usual shape (`detail[].loc`, `msg`, `type`), at most MAX_ERRORS."""
    return RequestValidationError(list(errors[:MAX_ERRORS]))


def problem(kind: str, loc: tuple[Any, ...], msg: str, value: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg}
    if value is not None:
        out["input"] = value
    return out


def _shape_error(loc: tuple[Any, ...], msg: str) -> dict[str, Any]:
    return problem("shape_mismatch", loc, msg)
