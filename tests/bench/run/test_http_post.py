"""The load client's HTTP/1.1 POST: replies read whole, chunked or sized, and what is not HTTP."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.run.http_post import HttpError, post_json, read_reply  # noqa: E402


def parse_reply(raw: bytes) -> tuple[int, bytes]:
    async def read() -> tuple[int, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_reply(reader)

    return asyncio.run(read())


def test_a_sized_reply_is_cut_at_its_length() -> None:
    raw = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}trailing'
    assert parse_reply(raw) == (200, b'{"a":1}')


def test_a_chunked_reply_is_joined() -> None:
    raw = b'HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{"a"\r\n9;x=1\r\n:[1,2,3]}\r\n0\r\n\r\n'
    assert parse_reply(raw) == (400, b'{"a":[1,2,3]}')


def test_a_reply_read_to_its_end_needs_no_length() -> None:
    assert parse_reply(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nbody") == (200, b"body")


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"", "ended early"),
        (b"garbage", "ended early"),
        (b"HTTP/1.1 OK\r\n\r\n", "not an HTTP reply"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP reply"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "ended early"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\nshort", "not an HTTP reply"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not an HTTP reply"),
    ],
)
def test_what_is_not_a_whole_http_reply_is_an_error(raw: bytes, message: str) -> None:
    with pytest.raises(HttpError, match=message):
        parse_reply(raw)


def test_only_plain_http_urls() -> None:
    with pytest.raises(ValueError, match="plain http://host:port only"):
        asyncio.run(post_json("https://127.0.0.1:1", "/generate", {}, 1.0))


def test_a_reply_is_read_without_waiting_for_the_server_to_close() -> None:
    import time

    async def run() -> tuple[tuple[int, bytes], float]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
            await writer.drain()
            await asyncio.sleep(5)  # keeps the connection open, whatever the request asked
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t0 = time.perf_counter()
        reply = await post_json(f"http://127.0.0.1:{port}", "/generate", {"text": "x"}, 10.0)
        elapsed = time.perf_counter() - t0
        server.close()
        return reply, elapsed

    reply, elapsed = asyncio.run(run())
    assert reply == (200, b"ok") and elapsed < 2.0
