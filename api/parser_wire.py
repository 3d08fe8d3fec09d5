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
    payload: bytes = field(default=b"", repr=False)

    def encode(self) -> bytes:
        return self.encode_head() + self.payload

    def encode_head(self) -> bytes:
        """The frame but its payload, which may then be written as it is, not copied."""
        head = json.dumps(self.header, separators=(",", ":")).encode()
        return _LENGTHS.pack(len(head), len(self.payload)) + head

    @staticmethod
    def read(read_exactly: Callable[[int], bytes], max_payload: int) -> Frame:
        """The next frame, from `read_exactly(n)` (n bytes, or fewer only at the end)."""
        lengths = read_exactly(_LENGTHS.size)
        if len(lengths) != _LENGTHS.size:
            raise WireError("the stream ended between frames")
        head_len, payload_len = _LENGTHS.unpack(lengths)
        if head_len > MAX_HEADER or payload_len > max_payload:
            raise WireError(f"a frame of {head_len} + {payload_len} bytes: past the bounds")
        head = read_exactly(head_len)
        payload = read_exactly(payload_len) if payload_len else b""
        if len(head) != head_len or len(payload) != payload_len:
            raise WireError("the stream ended inside a frame")
        try:
            header = json.loads(head)
        except ValueError as e:
            raise WireError(f"a header that is not JSON: {e}") from e
        if not isinstance(header, dict):
            raise WireError("a header that is not a JSON object")
        return Frame(header, payload)
