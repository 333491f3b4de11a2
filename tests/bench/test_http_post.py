"""The load client's HTTP/1.1 POST: replies read whole, chunked or sized, and what is not HTTP."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.http_post import HttpError, parse_reply, post_json  # noqa: E402


def test_a_sized_reply_is_cut_at_its_length() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}trailing"
    assert parse_reply(raw) == (200, b'{"a":1}')


def test_a_chunked_reply_is_joined() -> None:
    raw = b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n9;x=1\r\n:[1,2,3]}\r\n0\r\n\r\n"
    assert parse_reply(raw) == (400, b'{"a":[1,2,3]}')


def test_a_reply_read_to_its_end_needs_no_length() -> None:
    assert parse_reply(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nbody") == (200, b"body")


@pytest.mark.parametrize("raw", [b"", b"garbage", b"HTTP/1.1 OK\r\n\r\n", b"SSH-2.0-OpenSSH\r\n\r\n"])
def test_what_is_not_http_is_an_error(raw: bytes) -> None:
    with pytest.raises(HttpError, match="not an HTTP reply"):
        parse_reply(raw)


def test_only_plain_http_urls() -> None:
    with pytest.raises(ValueError, match="plain http://host:port only"):
        asyncio.run(post_json("https://127.0.0.1:1", "/generate", {}, 1.0))
