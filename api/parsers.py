"""What the API asks of its parser children (api.parser_pool): every untrusted file, an
upload (archive, .npz, IDX) and each image file sent to predict, is read in a child with
hard limits, so that a parser bug costs one child and a clear 4xx, never the API's memory
or its slots. `Parsers` holds the API process's two pools and checks each answer as it
would an input: a child is assumed compromisable. See docs/datasets.md ("Parsing in a
child")."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import math
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.images import DECODE_WAIT_S, DecodeBudget, DecodeBusy, KeyBudget
from api.parser_pool import (
    Bounds,
    Limits,
    ParserFailed,
    ParserPool,
    PoolBusy,
    PoolDown,
    Refused,
    wall_s,
)
from api.parser_wire import Frame
from api.photo_sets import THUMBS_PER_CLASS, PhotoOptions
from core.config import Settings
from core.datasets import MAX_CLASSES, MAX_SIDE, MAX_UNCOMPRESSED_BYTES, MIN_CLASSES, ParsedDataset
from core.errors import DatasetTooLarge, InvalidDataset, Unavailable

log = logging.getLogger(__name__)

IMAGE_PARSER_MEMORY = 1 << 30  # one image: at most 64 MiB decoded, as much in coefficients
IMAGE_CPU_S = 5.0
IMAGE_WALL_S = DECODE_WAIT_S + 10.0  # the decode budget's wait, then the decode
MAX_MESSAGE = 2000  # characters of a child's refusal passed on
MAX_THUMBNAIL = 4 * MAX_SIDE * MAX_SIDE  # a PNG of MAX_SIDE² RGB, stored, with room
# A data set's answer: the canonical .npz (its pixels at most MAX_UNCOMPRESSED_BYTES, its
# labels and zip headers a few MiB more), then the thumbnails' PNGs.
UPLOAD_REPLY = MAX_UNCOMPRESSED_BYTES + (64 << 20) + MAX_CLASSES * THUMBS_PER_CLASS * MAX_THUMBNAIL


class Parsers:
    """The API process's two pools: uploads (one child per upload slot, a CPU budget that
    grows with the upload's size) and predict's images (kept warm: a request pays a pipe's
    round trip, not a child's start; one key holds at most half of them)."""

    def __init__(self, settings: Settings) -> None:
        self.decode_budget = DecodeBudget(settings.max_decode_bytes)
        self.upload_pool = ParserPool(
            "upload",
            settings.max_parallel_uploads,
            Limits(settings.upload_parser_memory, settings.upload_parser_cpu_s,
                   wall_s(settings.upload_parser_cpu_s), requests=100),
        )  # fmt: skip
        self.upload_cpu_s_per_mib = settings.upload_parser_cpu_s_per_mib
        self.image_pool = ParserPool(
            "image",
            settings.predict_parsers,
            Limits(IMAGE_PARSER_MEMORY, IMAGE_CPU_S, IMAGE_WALL_S),
            wait_s=DECODE_WAIT_S,
            per_key=max(1, settings.predict_parsers // 2),
        )

    def for_key(self, owner: str | None) -> KeyDecoder:
        """Predict's image files as `owner`'s request decodes them."""
        return KeyDecoder(self, self.decode_budget.for_key(owner), owner or "")

    def warm(self) -> None:
        """Predict's children started now; an upload's start with the first upload (a
        third of a second, beside seconds of reading), so that the API's own start shares
        its CPU with as few as may be."""
        self.image_pool.warm(self.image_pool.size)

    def close(self) -> None:
        self.upload_pool.close()
        self.image_pool.close()

    def upload(self, data: bytes, max_images: int, options: PhotoOptions) -> ParsedDataset:
        """api.uploads.parse_upload, in a child: InvalidDataset or DatasetTooLarge as it
        raises them, and DatasetTooLarge for an upload that overran a child's limit;
        PoolBusy if no child came free; Unavailable if none could be started."""
        cpu_s = self.upload_pool.limits.cpu_s + len(data) / (1 << 20) * self.upload_cpu_s_per_mib
        request = Frame(
            {"op": "upload", "max_images": max_images, "options": dataclasses.asdict(options)},
            data,
        )
        try:
            reply = self.upload_pool.call(
                request, Bounds(UPLOAD_REPLY), cpu_s=cpu_s, wall_s=wall_s(cpu_s)
            )
        except ParserFailed as e:
            if e.killed:
                raise _killed() from e
            if e.limit:
                raise DatasetTooLarge(f"the upload {e.why}") from e
            raise InvalidDataset(f"the upload could not be read: it {e.why}") from e
        except Refused as e:
            message = e.message[:MAX_MESSAGE]
            if e.kind == "DatasetTooLarge":
                raise DatasetTooLarge(message) from e
            if e.kind == "InvalidDataset":
                raise InvalidDataset(message) from e
            raise InvalidDataset(f"the upload could not be read ({message})") from e
        except PoolDown as e:
            raise _down(e) from e
        return _parsed(reply)

    def images(
        self,
        files: list[bytes],
        shape: tuple[int, int, int],
        invert: bool,
        budget: KeyBudget,
        fit: str | None,
        owner: str = "",
    ) -> list[bytes | str]:
        """api.images.decode_image of each file, in a warm child that reserves `budget`
        through the pipe: each file's pixels, or why it was refused (a file that ended the
        child refuses the request's files together); DecodeBusy as decode_image raises it,
        or when no child `owner` may take came free; Unavailable if none could be started."""
        request = Frame(
            {"op": "images", "shape": list(shape), "invert": invert, "fit": fit,
             "sizes": [len(f) for f in files]},
            b"".join(files),
        )  # fmt: skip

        def reserve(size: int, held: ExitStack) -> None:
            held.enter_context(budget.reserve(size))

        c, h, w = shape
        bounds = Bounds(reply=len(files) * c * h * w, messages=2 * len(files))
        cpu_s = IMAGE_CPU_S * len(files)
        try:
            reply = self.image_pool.call(
                request, bounds, owner=owner, cpu_s=cpu_s, wall_s=IMAGE_WALL_S + cpu_s,
                on_reserve=reserve,
            )  # fmt: skip
        except ParserFailed as e:
            if e.killed:
                raise _killed() from e
            return [e.why] * len(files)
        except Refused as e:
            if e.kind == "DecodeBusy":
                raise DecodeBusy(e.message[:MAX_MESSAGE]) from e
            return [f"could not be read ({e.message[:MAX_MESSAGE]})"] * len(files)
        except PoolBusy as e:
            raise DecodeBusy(f"{e} decoding images (predict_parsers)") from e
        except PoolDown as e:
            raise _down(e) from e
        return _decoded(reply, len(files), c * h * w)


@dataclass(frozen=True)
class KeyDecoder:
    """Parsers.images for one key's request, within that key's share of the decode budget
    and of the children."""

    parsers: Parsers
    budget: KeyBudget
    owner: str

    def decode(self, files: list[bytes], shape: tuple[int, int, int], invert: bool,
               fit: str | None) -> list[bytes | str]:  # fmt: skip
        return self.parsers.images(files, shape, invert, self.budget, fit, self.owner)


def _down(e: PoolDown) -> Unavailable:
    log.error("no parser child could be started: %s", e)
    return Unavailable(
        "this API process cannot start a child process to read the files sent now (is its "
        "temporary folder's disk full?): retry shortly"
    )


def _killed() -> Unavailable:
    """A child killed from outside (the kernel's OOM killer, an operator): the input did not
    cause it (a child's own memory limit raises MemoryError), so the client may retry."""
    log.warning("a parser child was killed from outside while it read a request")
    return Unavailable(
        "the process reading the files sent was killed (out of memory on this host?): retry shortly"
    )


class _ParsedFields(BaseModel):
    """A ParsedDataset's fields as a child answers them (all but its bytes), checked."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    image_shape: tuple[int, int, int]
    num_classes: int = Field(ge=MIN_CLASSES, le=MAX_CLASSES)
    train_count: int = Field(ge=1)
    test_count: int = Field(ge=0)
    classes: tuple[str, ...] | None = Field(max_length=MAX_CLASSES)
    mean: tuple[float, ...] = Field(max_length=3)
    std: tuple[float, ...] = Field(max_length=3)
    class_counts: dict[str, list[int]] | None
    holdout_count: int = Field(ge=0)
    preprocessing: dict[str, Any] | None
    skipped: list[dict[str, str]] | None
    thumbnails: list[list[int]] | None = Field(max_length=MAX_CLASSES)  # PNG sizes


def _parsed(reply: Frame) -> ParsedDataset:
    """The child's data set, its fields checked as any input's are and its hash made here;
    the payload is the thumbnails' PNGs, then the .npz (kept as read: no copy)."""
    try:
        fields = _ParsedFields.model_validate(reply.header.get("parsed"))
    except ValidationError as e:
        why = f"{e.error_count()} fields that do not check out"
        raise InvalidDataset(f"the upload could not be read: the parser answered {why}") from e
    payload = bytearray(reply.payload) if isinstance(reply.payload, bytes) else reply.payload
    sizes = [n for per_class in fields.thumbnails or [] for n in per_class]
    if any(n < 0 or n > MAX_THUMBNAIL for n in sizes) or sum(sizes) > len(payload):
        raise InvalidDataset("the upload could not be read: the parser answered out of turn")
    thumbnails = None
    if fields.thumbnails is not None:
        thumbnails = _thumbnails(fields.thumbnails, payload)
        del payload[: sum(sizes)]  # the thumbnails, from the front: no copy of the .npz
    c, h, w = fields.image_shape
    if not (c in (1, 3) and 0 < h <= MAX_SIDE and 0 < w <= MAX_SIDE) or not all(
        math.isfinite(v) for v in (*fields.mean, *fields.std)
    ):
        raise InvalidDataset("the upload could not be read: the parser answered out of turn")
    values = fields.model_dump()
    values["thumbnails"] = thumbnails
    npz: Any = payload  # a bytearray: stored as the bytes it holds
    return ParsedDataset(npz=npz, sha256=hashlib.sha256(payload).hexdigest(), **values)


def _thumbnails(sizes: list[list[int]], payload: bytearray) -> list[list[str]]:
    """Each class's thumbnails, as the set's record keeps them (base64 PNGs)."""
    out: list[list[str]] = []
    start = 0
    for per_class in sizes:
        out.append([])
        for n in per_class:
            out[-1].append(base64.b64encode(payload[start : start + n]).decode())
            start += n
    return out


def _decoded(reply: Frame, count: int, size: int) -> list[bytes | str]:
    """The child's answer to an images request, cut into each file's pixels or refusal."""
    results = reply.header.get("results")
    out_of_turn: list[bytes | str] = ["ended the parser (it answered out of turn)"] * count
    if not isinstance(results, list) or len(results) != count:
        return out_of_turn
    if len(reply.payload) != sum(r is None for r in results) * size:
        return out_of_turn
    out: list[bytes | str] = []
    start = 0
    for r in results:
        if r is None:
            out.append(bytes(reply.payload[start : start + size]))
            start += size
        else:
            out.append(str(r)[:MAX_MESSAGE])
    return out
