"""A lean HTTP/1.1 load generator: `clients` keep-alive connections on loopback, each sending
its next request as soon as the last answer is in (closed loop), for `n` requests or
`budget_s` seconds. Requests are pre-encoded bytes and answers are read by Content-Length,
so the generator spends a few tens of microseconds per request and leaves the CPU to the
server (an httpx client costs about a millisecond per request, as much as the server).

    python -m bench.loadgen URL METHOD PATH --key K [--body JSON] [-n 5000] [-c 50]
                            [--rate R]

Closed loop by default (the most the server does); with --rate R, open loop at R
requests/s (the latency at a given load).

Prints one JSON object: requests, requests/s, p50/p90/p99/max in ms and status codes."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any
from urllib.parse import urlsplit


def encode_request(method: str, host: str, path: str, key: str, body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {key}"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def read_response(reader: asyncio.StreamReader) -> int:
    """The status code of one answer, its body read and dropped (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    i = lower.find(b"content-length:")
    if i >= 0:
        length = int(lower[i + 15 : lower.index(b"\r\n", i)])
        await reader.readexactly(length)
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def run(
    url: str,
    request: bytes,
    n: int,
    clients: int,
    budget_s: float,
    warmup: int,
    rate: float | None = None,
) -> dict[str, Any]:
    parts = urlsplit(url)
    latencies: list[float] = []
    codes: dict[int, int] = {}
    left = n + warmup
    deadline = time.monotonic() + budget_s

    async def client(i: int) -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        # Open loop (--rate): this client's requests are due every clients/rate seconds,
        # staggered between clients, and a request's latency counts from when it was due,
        # so a stalled server cannot hide its stall by delaying the requests behind it.
        period = clients / rate if rate else 0.0
        due = time.perf_counter() + i * period / clients
        try:
            while left > 0 and time.monotonic() < deadline:
                left -= 1
                counted = left < n  # the first `warmup` requests are not counted
                if rate:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    t = due
                    due += period
                else:
                    t = time.perf_counter()
                writer.write(request)
                status = await read_response(reader)
                if counted:
                    latencies.append(time.perf_counter() - t)
                    codes[status] = codes.get(status, 0) + 1
        finally:
            writer.close()

    start = time.perf_counter()
    first: float | None = None

    async def mark_start() -> None:
        nonlocal first
        while left > n:
            await asyncio.sleep(0.001)
        first = time.perf_counter()

    marker = asyncio.create_task(mark_start())
    await asyncio.gather(*[client(i) for i in range(clients)])
    wall = time.perf_counter() - (first or start)
    marker.cancel()
    latencies.sort()

    def q(p: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    return {
        "requests": len(latencies),
        "clients": clients,
        "offered_rate": rate,
        "requests_per_second": round(len(latencies) / wall, 1),
        "p50_ms": q(0.5),
        "p90_ms": q(0.9),
        "p99_ms": q(0.99),
        "max_ms": q(1.0),
        "status_codes": codes,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("method", choices=["GET", "POST"])
    p.add_argument("path")
    p.add_argument("--key", required=True)
    p.add_argument("--body", help="a JSON body (POST)")
    p.add_argument("-n", type=int, default=5000, help="requests counted")
    p.add_argument("-c", type=int, default=50, help="concurrent clients")
    p.add_argument("--warmup", type=int, default=200, help="requests sent first, not counted")
    p.add_argument("--rate", type=float, help="open loop: requests/s offered in all")
    p.add_argument("--budget-s", type=float, default=60)
    p.add_argument("--cpu", type=int, help="pin the generator to this CPU")
    args = p.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    body = json.dumps(json.loads(args.body)).encode() if args.body else None
    parts = urlsplit(args.url)
    request = encode_request(args.method, parts.netloc, args.path, args.key, body)
    result = asyncio.run(
        run(args.url, request, args.n, args.c, args.budget_s, args.warmup, args.rate)
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
