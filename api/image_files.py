"""Images sent to POST /jobs/{id}/predict as PNG or JPEG files, converted to the model's
channels, resized to its H×W and scaled to [0, 1]. See docs/api.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import HTTPException
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from api.body import BODY_SLACK, CappedRequest, refuse_large_file
from api.json_images import invalid, problem

if TYPE_CHECKING:
    import torch

    from api.parsers import KeyDecoder

MAX_FILES = 32  # per multipart request
MAX_FILE_BYTES = 1 << 20  # per file
MAX_MULTIPART_BYTES = MAX_FILES * MAX_FILE_BYTES + BODY_SLACK
_BOOL = TypeAdapter(bool)


async def read_file_images(
    request: Request,
    shape: tuple[int, int, int],
    invert: bool,
    decoder: KeyDecoder,
    fit: str | None = None,
) -> torch.Tensor:
    """The request's files as an (N, C, H, W) tensor; `invert` or the form's own `invert`
    takes dark-on-light images; `fit`: the model's set's (api.images.decode_image). Each file is
    decoded in a parser child (api.parsers), waited for in the threadpool, never on the
    event loop."""
    files, form_invert = await _read_files(request)
    try:
        return await run_in_threadpool(
            _images_from_files, files, shape, invert or form_invert, decoder, fit
        )
    finally:
        for f in files:
            await f.close()


async def _read_files(request: Request) -> tuple[list[UploadFile], bool]:
    """The uploaded files (open: the caller closes them) and the form's `invert`."""
    form = await _read_form(request)
    files, invert, errors = _form_fields(form)
    if not files and not errors:
        errors.append(
            problem(
                "missing", ("body", "files"), "send at least one PNG or JPEG file in field 'files'"
            )
        )
    if errors:
        await form.close()
        raise invalid(errors)
    return files, invert


async def _read_form(request: Request) -> FormData:
    capped = CappedRequest(
        request,
        MAX_MULTIPART_BYTES,
        f"multipart body over {MAX_MULTIPART_BYTES} bytes: at most {MAX_FILES} files of "
        f"{MAX_FILE_BYTES} bytes (1 MiB) each",
    )
    try:
        return await capped.form(max_files=MAX_FILES, max_fields=8, max_part_size=1024)
    except StarletteHTTPException as e:
        if e.status_code != 400:
            raise
        # Starlette's 400s for multipart (too many files, malformed body, ...).
        if "Too many files" in str(e.detail):
            found = problem(
                "too_many_files", ("body", "files"), f"at most {MAX_FILES} files per request"
            )
        else:
            found = problem("multipart", ("body",), e.detail)
        raise invalid([found]) from e


def _form_fields(form: FormData) -> tuple[list[UploadFile], bool, list[dict[str, Any]]]:
    """The form's files, its `invert`, and the problems with its fields."""
    files: list[UploadFile] = []
    errors: list[dict[str, Any]] = []
    invert = False
    for key, value in form.multi_items():
        if key == "files":
            if isinstance(value, UploadFile):
                files.append(value)
            else:
                errors.append(problem("not_a_file", ("body", "files"), "must be a file"))
        elif key == "invert" and isinstance(value, str):
            try:
                invert = _BOOL.validate_python(value)
            except ValidationError as e:
                [err] = e.errors(include_url=False)  # one value, one error
                shown = value if len(value) <= 100 else None  # a long input is not echoed
                errors.append(problem(err["type"], ("body", "invert"), err["msg"], shown))
        else:
            errors.append(
                problem(
                    "unknown_field",
                    ("body", key),
                    "unknown form field: send images in 'files' (and 'invert')",
                )
            )
    return files, invert, errors


def _images_from_files(
    files: list[UploadFile],
    shape: tuple[int, int, int],
    invert: bool,
    decoder: KeyDecoder,
    fit: str | None = None,
) -> torch.Tensor:
    import torch

    c, h, w = shape
    if c not in (1, 3):
        raise HTTPException(
            422, detail=f"this model takes {c}-channel images: send them as JSON arrays"
        )
    errors: list[dict[str, Any]] = []
    names, data = [], []
    for i, f in enumerate(files):
        name = f.filename or f"files[{i}]"
        refuse_large_file(
            f, MAX_FILE_BYTES, f"file {name!r} (files[{i}])", f"{MAX_FILE_BYTES} (1 MiB) per file"
        )
        names.append(name)
        data.append(f.file.read(MAX_FILE_BYTES + 1))
    decoded: list[bytes] = []
    for i, (name, out) in enumerate(zip(names, decoder.decode(data, (c, h, w), invert, fit),
                                        strict=True)):  # fmt: skip
        if isinstance(out, bytes):
            decoded.append(out)
        else:
            errors.append(problem("invalid_image", ("body", "files", i), f"{name!r}: {out}"))
    if errors:
        raise invalid(errors)
    raw = torch.frombuffer(bytearray(b"".join(decoded)), dtype=torch.uint8)
    # Pillow's bytes are H, W, C (interleaved RGB); the model takes C, H, W.
    return raw.reshape(len(decoded), h, w, c).permute(0, 3, 1, 2).float().div(255)
