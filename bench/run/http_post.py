"""One JSON POST over plain HTTP/1.1 on asyncio streams: what a level of hundreds of requests in
flight sends without a thread per request.

A level's requests finish together at the end of each wave, and the next wave starts only as the
client answers them. With a thread per request (`requests`, under the GIL) a wave of 250 took about
0.29 s to turn around against an instant local server on two cores, against 0.04 s with this: time
that lands in every wave boundary of the measured server (docs/measurements.md, 2026-12-02).
One connection per request (`Connection: close`), its reply read as long as it says it is, is all
SGLang's HTTP server needs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class HttpError(OSError):
    """A reply that is not HTTP."""


def _target(url: str, path: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url!r}: the load client speaks plain http://host:port only")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/") + path


def _head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    status_line, *header_lines = head.rstrip(b"\r\n").split(b"\r\n")
    fields = status_line.split(b" ", 2)
    if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
        raise HttpError(f"not an HTTP reply: {head[:80]!r}")
    return int(fields[1]), {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in header_lines)}


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    out: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return b"".join(out)
        out.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the chunk's CRLF


async def _body(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status, headers = _head(await reader.readuntil(b"\r\n\r\n"))
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        return status, await _chunks(reader)
    if b"content-length" in headers:
        return status, await reader.readexactly(int(headers[b"content-length"]))
    return status, await reader.read()


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and body of one HTTP/1.x reply: as long as it says, chunk by chunk, or to the end."""
    try:
        return await _body(reader)
    except asyncio.IncompleteReadError as e:
        raise HttpError(f"the reply ended early: {e.partial[:80]!r}") from None
    except (asyncio.LimitOverrunError, ValueError) as e:
        raise HttpError(f"not an HTTP reply: {e}") from None


async def post_json(url: str, path: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes]:
    """POST body as JSON to url + path; the reply's status and body. Raises OSError or TimeoutError."""
    host, port, target = _target(url, path)
    data = json.dumps(body).encode()
    request = (
        f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode() + data

    async def exchange() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request)
            await writer.drain()
            return await read_reply(reader)
        finally:
            writer.close()

    return await asyncio.wait_for(exchange(), timeout)
