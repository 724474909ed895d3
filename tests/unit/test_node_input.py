"""What a node says is input (hardening round three, class 4).

* Every spelling of an address: an endpoint a node's agent gives is checked in its
  IPv4 form whatever IPv6 form wraps it (mapped, compatible, 6to4, NAT64), so that no
  check written for IPv4 (loopback, broadcast, the mesh's own addresses) is passed by
  another spelling; an address a node could really have is taken in any spelling and
  written back in one.
* One bounded JSON reader (``core.jsonread``) for everything a node or a user sends:
  nesting, size, count and NaN are refused with ``BadJson``, never ``RecursionError``;
  each reader of a node's answer is fed generated hostile JSON here.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_burst.core.jsonread import BadJson, read_json
from slurm_burst.core.mesh import Refused, endpoint_of
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.resumefile import ResumeFileError, parse_resume_file
from slurm_burst.core.staging import StagingError, parse_manifest, parse_pointer
from slurm_burst.services import nodestage
from tests.conftest import examples
from tests.unit.test_node_api import api_with

pytestmark = pytest.mark.unit

SUBNET = "10.77.0.0/24"


def spellings(v4: ipaddress.IPv4Address, port: int) -> list[str]:
    """``v4``:``port`` as an agent could write it: IPv4, IPv4-mapped IPv6 (two ways),
    IPv4-compatible, 6to4, NAT64."""
    n = int(v4)
    mapped = ipaddress.IPv6Address((0xFFFF << 32) | n)
    return [
        f"{v4}:{port}",
        f"[::ffff:{v4}]:{port}",
        f"[{mapped.exploded}]:{port}",
        f"[{ipaddress.IPv6Address(n)}]:{port}",
        f"[{ipaddress.IPv6Address((0x2002 << 112) | (n << 80))}]:{port}",
        f"[{ipaddress.IPv6Address((0x64FF9B << 96) | n)}]:{port}",
    ]


def forbidden(v4: ipaddress.IPv4Address) -> bool:
    return (
        v4.is_loopback or v4.is_multicast or v4.is_unspecified or v4.is_link_local
        or v4.is_reserved or v4 in ipaddress.ip_network("0.0.0.0/8")
        or v4 in ipaddress.ip_network(SUBNET)
    )  # fmt: skip


V4 = st.one_of(
    st.ip_addresses(v=4),
    st.sampled_from([
        "127.0.0.1", "127.255.255.254", "0.0.0.0", "255.255.255.255", "224.0.0.1",
        "239.255.255.250", "169.254.169.254", "10.77.0.1", "10.77.0.9", "10.77.0.255",
        "240.0.0.1", "0.1.2.3", "10.0.0.5", "172.16.3.4", "192.168.1.10",
    ]).map(ipaddress.IPv4Address),
)  # fmt: skip


@settings(max_examples=examples(1000))
@given(v4=V4, port=st.integers(1, 65535))
def test_every_spelling_of_an_address_gets_its_ipv4_forms_answer(
    v4: ipaddress.IPv4Address, port: int
) -> None:
    plain, mapped, mapped_long, *wrapped = spellings(v4, port)
    if forbidden(v4):
        for text in (plain, mapped, mapped_long, *wrapped):
            with pytest.raises(ValueError):
                endpoint_of(text, SUBNET)
        return
    assert endpoint_of(plain, SUBNET) == f"{v4}:{port}"
    # the mapped forms are the same address: taken, and written back as IPv4
    assert endpoint_of(mapped, SUBNET) == endpoint_of(mapped_long, SUBNET) == f"{v4}:{port}"
    for text in wrapped:  # tunnelled and translated forms: no node listens at one
        with pytest.raises(ValueError):
            endpoint_of(text, SUBNET)


@settings(max_examples=examples(1000))
@given(v6=st.ip_addresses(v=6), port=st.integers(1, 65535))
def test_an_ipv6_endpoint_is_a_unicast_address_of_the_nodes_own(
    v6: ipaddress.IPv6Address, port: int
) -> None:
    text = f"[{v6}]:{port}"
    try:
        said = endpoint_of(text, SUBNET)
    except ValueError:
        return
    host = said.rpartition(":")[0].strip("[]")
    addr = ipaddress.ip_address(host)
    assert not (addr.is_loopback or addr.is_multicast or addr.is_unspecified), said
    assert not addr.is_link_local and not addr.is_reserved, said
    if addr.version == 4:  # unwrapped: only a mapped address becomes IPv4
        assert v6.ipv4_mapped == addr and not forbidden(addr), said


@pytest.mark.parametrize(
    "text",
    ["[::ffff:127.0.0.1]:51820", "[::ffff:10.77.0.1]:51820", "[::ffff:255.255.255.255]:9",
     "[::ffff:0.0.0.0]:9", "[::ffff:224.0.0.251]:5353", "255.255.255.255:51820",
     "[::127.0.0.1]:9", "[2002:7f00:1::]:9", "[64:ff9b::a4d:1]:9", "[fe80::1%wg0]:9",
     "[10.0.0.5]:9", "::1:9", "10.0.0.5:051820"],
)  # fmt: skip
def test_the_node_api_refuses_an_endpoint_in_another_spelling(tmp_path: Path, text: str) -> None:
    api, store = api_with(tmp_path, ("burst-dir-1", NodeState.JOINED, "lab"))
    with pytest.raises(Refused) as caught:
        api.peers(store.addresses()["burst-dir-1"], text)
    assert caught.value.status == 400


# -- one bounded JSON reader --------------------------------------------------------


def nested(depth: int, opener: str = "[") -> str:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "{":
        return '{"a":' * depth + "1" + "}" * depth
    return opener * depth + closer * depth


HOSTILE_JSON = st.one_of(
    st.integers(33, 200_000).map(nested),
    st.integers(33, 200_000).map(lambda d: nested(d, "{")),
    st.sampled_from(["NaN", "[Infinity]", '{"a": -Infinity}', "1" * 5000, "[1,]", "\ud800"]),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
)


@settings(max_examples=examples(500))
@given(text=HOSTILE_JSON)
def test_hostile_json_is_bad_json_never_a_recursion_error(text: str) -> None:
    try:
        read_json(text, "a node's answer")
    except BadJson as exc:
        assert str(exc).startswith("a node's answer: "), exc
        assert exc.code == "BadJson" and isinstance(exc, ValueError)


def test_the_bounds_are_each_named() -> None:
    assert read_json(nested(32), "x") is not None  # at the bound: taken
    with pytest.raises(BadJson, match="nested deeper than 32"):
        read_json(nested(33), "x")
    with pytest.raises(BadJson, match="nested deeper than 32"):
        read_json(nested(100_000), "x")  # json's own C scanner would raise RecursionError
    with pytest.raises(BadJson, match="11 bytes of JSON, over 10"):
        read_json("[1,2,3,4,5]", "x", max_bytes=10)
    with pytest.raises(BadJson, match="more than 3 JSON values"):
        read_json("[1,2,3]", "x", max_values=3)
    with pytest.raises(BadJson, match="NaN is not a JSON number"):
        read_json('{"v": NaN}', "x")


@settings(max_examples=examples(500))
@given(text=HOSTILE_JSON)
def test_every_reader_of_what_a_node_or_user_sends_refuses_it_cleanly(text: str) -> None:
    line = text.replace("\n", " ")
    assert nodestage._answer(f"noise\n{line}\n") in ({}, read_json_or_none(line))
    with pytest.raises(ResumeFileError):
        parse_resume_file(text)
    with pytest.raises(StagingError):
        parse_manifest(text.encode("utf-8", "surrogatepass"), "store x")
    with pytest.raises(StagingError):
        parse_pointer(text.encode("utf-8", "surrogatepass"), "store x")


def read_json_or_none(text: str) -> object:
    try:
        doc = read_json(text, "x")
    except BadJson:
        return None
    return doc if isinstance(doc, dict) else None


def test_a_notice_nested_deep_is_a_400_not_a_traceback(tmp_path: Path) -> None:
    api, store = api_with(tmp_path, ("burst-dir-1", NodeState.JOINED, "lab"))
    api.noticed = lambda rec, notice: {"ok": True}
    for body in (nested(100_000).encode(), nested(5000, "{").encode(), b'{"x": NaN}'):
        with pytest.raises(Refused) as caught:
            api.notice(store.addresses()["burst-dir-1"], body)
        assert caught.value.status == 400 and "notice" in str(caught.value)
