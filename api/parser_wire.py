"""The frames the API and its parser children (api.parsers, api.parser_child) exchange
over a pipe: a JSON header and raw bytes, never pickle. A frame is 12 bytes of lengths
(the header's, 4; the payload's, 8; big-endian), the header as UTF-8 JSON, then the
payload. Each side bounds what it reads: the API trusts a child no more than an upload."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_LENGTHS = struct.Struct(">IQ")
MAX_HEADER = 1 << 20  # a header is a few fields; a file's bytes travel as the payload


class WireError(Exception):
    """A frame that breaks the format: too long, not JSON, not an object, cut short."""


@dataclass(frozen=True)
class Frame:
    header: dict[str, Any]
    payload: bytes | bytearray = field(default=b"", repr=False)

    def encode(self) -> bytes:
        return self.encode_head() + self.payload

    def encode_head(self) -> bytes:
        """The frame but its payload, which may then be written as it is, not copied."""
        head = json.dumps(self.header, separators=(",", ":")).encode()
        return _LENGTHS.pack(len(head), len(self.payload)) + head

    @staticmethod
    def read(
        read_exactly: Callable[[int], bytes],
        max_payload: int,
        read_into: Callable[[memoryview], None] | None = None,
    ) -> Frame:
        """The next frame, from `read_exactly(n)` (n bytes, or fewer only at the end); its
        payload read by `read_into` into one buffer of its size, where given (no chunks
        joined: a copy of a large payload). Anything that is not a frame is a WireError."""
        lengths = read_exactly(_LENGTHS.size)
        if len(lengths) != _LENGTHS.size:
            raise WireError("the stream ended between frames")
        head_len, payload_len = _LENGTHS.unpack(lengths)
        if head_len > MAX_HEADER or payload_len > max_payload:
            raise WireError(f"a frame of {head_len} + {payload_len} bytes: past the bounds")
        head = read_exactly(head_len)
        if len(head) != head_len:
            raise WireError("the stream ended inside a frame")
        header = _header(head)
        payload: bytes | bytearray = b""
        if payload_len and read_into is not None:
            payload = bytearray(payload_len)
            read_into(memoryview(payload))
        elif payload_len:
            payload = read_exactly(payload_len)
            if len(payload) != payload_len:
                raise WireError("the stream ended inside a frame")
        return Frame(header, payload)


def _header(head: bytes) -> dict[str, Any]:
    try:
        header = json.loads(head)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested past the stack
        raise WireError(f"a header that is not JSON: {type(e).__name__}") from e
    if not isinstance(header, dict):
        raise WireError("a header that is not a JSON object")
    return header
