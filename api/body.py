"""Request bodies with a size limit: past it, TooLarge (413) saying what the limit is.
See docs/api.md."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from fastapi import Request
from starlette.datastructures import UploadFile

from core.errors import TooLarge

BODY_SLACK = 64 << 10  # multipart headers, boundaries and small fields; JSON brackets


class CappedRequest(Request):
    """The same request, but its body stream stops with a 413 past `cap` bytes: the
    Content-Length header is checked first, a chunked body as it arrives."""

    def __init__(self, request: Request, cap: int, detail: str) -> None:
        super().__init__(request.scope, request.receive)
        self._cap = cap
        self._detail = detail

    async def stream(self) -> AsyncGenerator[bytes, None]:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._cap:
            raise TooLarge(self._detail)
        size = 0
        async for chunk in super().stream():
            size += len(chunk)
            if size > self._cap:
                raise TooLarge(self._detail)
            yield chunk


def refuse_large_file(file: UploadFile, cap: int, what: str, limit: str) -> None:
    """A 413 for an uploaded file over `cap` bytes: "<what> is N bytes: at most <limit>"."""
    if file.size is not None and file.size > cap:
        raise TooLarge(f"{what} is {file.size} bytes: at most {limit}")
