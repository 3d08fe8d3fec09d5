"""What a parser child (api.parser_child) does with each request: an upload read into a
data set (api.uploads.parse_upload), or one image file decoded into a model's input
(api.images.decode_image). Each answer is a frame: the result, or the refusal by the name
of its exception and its message; a MemoryError or any other exception also retires the
child, which may no longer be sound."""

from __future__ import annotations

import base64
import dataclasses
import io
from typing import TYPE_CHECKING

# Imported as the child starts: its folder is gone by its first request.
from api.images import ImageRejected, decode_image
from api.parser_wire import Frame
from api.photo_sets import PhotoOptions
from api.uploads import parse_upload

if TYPE_CHECKING:
    from api.images import Reserves

# The refusals a parser makes on purpose, by name; the API raises each again as itself.
REFUSALS = ("InvalidDataset", "DatasetTooLarge", "ImageRejected", "DecodeBusy")


def answer(request: Frame, budget: Reserves) -> Frame:
    op = request.header.get("op")
    try:
        if op == "upload":
            return _upload(request)
        if op == "images":
            return _images(request, budget)
        return Frame({"error": "InvalidRequest", "message": f"no op {op!r}", "retire": True})
    except Exception as e:
        if _out_of_memory(e):
            return Frame({"error": "MemoryError", "message": "", "retire": True})
        name = type(e).__name__
        if name in REFUSALS:
            return Frame({"error": name, "message": str(getattr(e, "message", e))})
        return Frame({"error": "Crash", "message": f"{name}: {e}", "retire": True})


def _upload(request: Frame) -> Frame:
    options = PhotoOptions(**request.header["options"])
    parsed = parse_upload(bytes(request.payload), max_images=request.header["max_images"],
                          options=options)  # fmt: skip
    fields = dataclasses.asdict(parsed)
    del fields["npz"], fields["sha256"]  # the payload; its hash is the API's to make
    # The thumbnails' PNGs travel in the payload before the .npz, their sizes in the header:
    # a thousand classes of them would not fit a header.
    pngs = [[base64.b64decode(t) for t in per_class] for per_class in parsed.thumbnails or []]
    if parsed.thumbnails is not None:
        fields["thumbnails"] = [[len(p) for p in per_class] for per_class in pngs]
    return Frame(
        {"parsed": fields}, b"".join(p for per_class in pngs for p in per_class) + parsed.npz
    )


def _images(request: Frame, budget: Reserves) -> Frame:
    """Each file of a predict request decoded (the files' bytes one after another, their
    sizes in the header): the pixels of those decoded, one after another, and a refusal
    (or null) a file. DecodeBusy ends the whole request, as it would in the API."""
    c, h, w = request.header["shape"]
    invert, fit = bool(request.header["invert"]), request.header.get("fit")
    results: list[str | None] = []
    pixels: list[bytes] = []
    start = 0
    for size in request.header["sizes"]:
        data = io.BytesIO(request.payload[start : start + size])
        start += size
        try:
            pixels.append(decode_image(data, (c, h, w), invert, budget, fit))
            results.append(None)
        except ImageRejected as e:
            results.append(str(e))
    return Frame({"results": results}, b"".join(pixels))


def _out_of_memory(e: BaseException | None) -> bool:
    """Whether `e` is a MemoryError, or was raised while one was handled (a reader closed
    as the MemoryError unwound it, and failed in its turn)."""
    seen = 0
    while e is not None and seen < 32:
        if isinstance(e, MemoryError):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False
