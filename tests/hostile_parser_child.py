"""A parser child gone bad, for the tests of api.parser_pool and api.parsers: it greets as a
child does, then answers every request as `sys.argv[1]` says (a compromised parser would):

- huge: a payload of 1 GiB, announced in the frame's lengths
- nested: a header of JSON arrays nested a million deep
- refusal: {"error": <sys.argv[2]>, "message": ...}, a refusal the request cannot make
- releases: release messages without end
- nan: a data set whose mean is NaN
- no_classes: a data set of 0 classes
"""

from __future__ import annotations

import struct
import sys

from api.parser_wire import Frame

_LENGTHS = struct.Struct(">IQ")


def main() -> None:
    how = sys.argv[1]
    out = sys.stdout.buffer
    out.write(Frame({"ready": True, "network": "none"}).encode())
    out.flush()
    while True:
        try:
            Frame.read(sys.stdin.buffer.read, 1 << 30)
        except Exception:
            return
        out.write(_answer(how))
        out.flush()


def _answer(how: str) -> bytes:
    if how == "huge":
        return _LENGTHS.pack(2, 1 << 30) + b"{}" + bytes(1 << 20)
    if how == "nested":
        head = b"[" * 500_000 + b"]" * 500_000
        return _LENGTHS.pack(len(head), 0) + head
    if how == "refusal":
        return Frame({"error": sys.argv[2], "message": "made up"}).encode()
    if how == "releases":
        return Frame({"release": True}).encode() * 10_000
    mean = float("nan") if how == "nan" else 0.5
    parsed = {
        "image_shape": [1, 28, 28], "num_classes": 0 if how == "no_classes" else 2,
        "train_count": 10, "test_count": 2, "classes": None, "mean": [mean], "std": [0.2],
        "class_counts": None, "holdout_count": 0, "preprocessing": None, "skipped": None,
        "thumbnails": None,
    }  # fmt: skip
    return Frame({"parsed": parsed}, b"PK not an npz").encode()


if __name__ == "__main__":
    main()
