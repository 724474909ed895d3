"""The node API's HTTP server for real, on loopback (bound to the ``lo`` device as the
daemon binds it to the hub interface): the caller is the TCP peer address, refusals are
JSON with their status, and nothing but ``GET /v1/peers`` is served."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from slurm_burst.adapters.nodeapi import NodeApiServer
from slurm_burst.core.mesh import Refused


@pytest.fixture
def server() -> Iterator[tuple[NodeApiServer, list[tuple[str, str]]]]:
    asked: list[tuple[str, str]] = []

    def peers(source: str, endpoint: str) -> dict[str, Any]:
        asked.append((source, endpoint))
        if endpoint == "refuse":
            raise Refused(403, f"{source} is nobody")
        return {"node": "n1", "peers": []}

    srv = NodeApiServer(peers, ("127.0.0.1", 0), "lo")
    srv.start()
    try:
        yield srv, asked
    finally:
        srv.close()
    assert not srv.up


def get(srv: NodeApiServer, path: str) -> tuple[int, dict[str, Any]]:
    host, port = srv.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_peers_are_asked_for_by_the_callers_own_address(
    server: tuple[NodeApiServer, list[tuple[str, str]]],
) -> None:
    srv, asked = server
    assert get(srv, "/v1/peers?endpoint=10.251.0.5%3A51820") == (200, {"node": "n1", "peers": []})
    assert asked == [("127.0.0.1", "10.251.0.5:51820")]


@pytest.mark.parametrize(
    ("path", "status"),
    [("/v1/peers?endpoint=refuse", 403), ("/v1/notice", 404), ("/", 404),
     ("/v1/peers?endpoint=" + "a" * 2000, 404), ("/v1/peers/../../etc/passwd", 404)],
    ids=["refused", "other-path", "root", "long-url", "traversal"],
)  # fmt: skip
def test_what_is_not_served_is_said_in_json(
    server: tuple[NodeApiServer, list[tuple[str, str]]], path: str, status: int
) -> None:
    got, body = get(server[0], path)
    assert got == status and "error" in body


def post(srv: NodeApiServer, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    host, port = srv.address
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_notice_is_posted_by_the_callers_own_address_and_bounded() -> None:
    told: list[tuple[str, bytes]] = []

    def notice(source: str, body: bytes) -> dict[str, Any]:
        told.append((source, body))
        if body == b"refuse":
            raise Refused(400, "not a notice")
        return {"jobs": []}

    srv = NodeApiServer(lambda s, e: {}, ("127.0.0.1", 0), "lo", notice=notice)
    srv.start()
    try:
        assert post(srv, "/v1/notice", b'{"action": "terminate"}') == (200, {"jobs": []})
        assert told == [("127.0.0.1", b'{"action": "terminate"}')]
        assert post(srv, "/v1/notice", b"refuse")[0] == 400
        assert post(srv, "/v1/notice", b"x" * 5000)[0] == 413  # never read, never handed on
        assert post(srv, "/v1/peers", b"{}")[0] == 404
        assert len(told) == 2
    finally:
        srv.close()


def test_without_a_notice_handler_a_notice_is_not_served(
    server: tuple[NodeApiServer, list[tuple[str, str]]],
) -> None:
    assert post(server[0], "/v1/notice", b"{}")[0] == 404
