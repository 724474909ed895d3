"""Hostlist grammar: table-driven cases (``tests/integration`` checks it against scontrol)."""

from __future__ import annotations

import pytest

from slurm_burst.core.hostlist import HostlistError, compress, expand, expand_unique, sort_names

EXPAND_CASES = [
    ("burst-[1-3]", ["burst-1", "burst-2", "burst-3"]),
    ("a[01-03]", ["a01", "a02", "a03"]),
    ("a[001-3]", ["a001", "a002", "a003"]),
    ("a[1-010]", [f"a{i}" for i in range(1, 11)]),
    ("gpu-a[01-02]-[1-2]", ["gpu-a01-1", "gpu-a01-2", "gpu-a02-1", "gpu-a02-2"]),
    ("x[3,1-2]", ["x3", "x1", "x2"]),
    ("a[1-2],a1", ["a1", "a2", "a1"]),
    ("login,gpu7", ["login", "gpu7"]),
    ("a b", ["a", "b"]),
    ("[1-2]", ["1", "2"]),
]


@pytest.mark.parametrize(("expr", "names"), EXPAND_CASES, ids=[c[0] for c in EXPAND_CASES])
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


COMPRESS_CASES = [
    (["a1", "a2", "a3", "a1"], "a[1-3,1]", "a[1,1-3]"),
    (["a9", "a10"], "a[9-10]", "a[9-10]"),
    (["a8", "a09"], "a[8,09]", "a[8,09]"),
    (["b1", "a1", "a10", "a2", "a02"], "b1,a[1,10,2,02]", "a[1-2,02,10],b1"),
    (["n10", "n9", "m1", "n"], "n[10,9],m1,n", "m1,n,n[9-10]"),
    (["a5"], "a5", "a5"),
    (["a1x", "a2x"], "a1x,a2x", "a1x,a2x"),
]


@pytest.mark.parametrize(
    ("names", "kept", "sorted_"), COMPRESS_CASES, ids=[",".join(c[0]) for c in COMPRESS_CASES]
)
def test_compress(names: list[str], kept: str, sorted_: str) -> None:
    assert compress(names) == kept
    assert compress(names, sort=True) == sorted_


def test_unique_drops_repeats_and_sorts() -> None:
    assert compress(["a3", "a1", "a2", "a1"], unique=True) == "a[1-3]"
    assert expand_unique("a[1-2],a1,b") == ["a1", "a2", "b"]


BAD = [
    ("a[2-1]", 2, "reversed"),
    ("a[1-2", 1, "never closed"),
    ("a1-2]", 4, "without a matching"),
    ("a[]", 2, "empty brackets"),
    ("a[1,,2]", 4, "empty range"),
    ("a,,b", 2, "empty part"),
    ("a,", 1, "empty part"),
    ("a[1-2]x", 6, "after ']'"),
    ("a[[1]]", 2, "nested"),
    ("n1;reboot", 2, "not allowed"),
    ("n$(id)", 1, "not allowed"),
    ("n`id`", 1, "not allowed"),
    ("a[x-2]", 2, "not N or N-M"),
    ("n[1-2000001]", 2, "cap"),
    ("n[1-2000],m[1-2000]", 10, "cap"),
    ("", 0, "empty hostlist"),
    ("ok1,-oProxyCommand", 4, "cannot start with"),
]


@pytest.mark.parametrize(("expr", "pos", "fragment"), BAD, ids=[repr(b[0]) for b in BAD])
def test_bad_input_names_position(expr: str, pos: int, fragment: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand(expr, max_names=3000 if "m[" in expr else 1_000_000)
    assert info.value.position == pos
    assert fragment in info.value.message


def test_compress_rejects_bad_names() -> None:
    with pytest.raises(HostlistError):
        compress(["ok1", "bad name"])


def test_sort_names_natural_prefix() -> None:
    assert sort_names(["r10-n1", "r2-n1", "r1-n1"]) == ["r1-n1", "r2-n1", "r10-n1"]


def test_sorted_keeps_every_name_where_slurm_drops_one() -> None:
    """`scontrol show hostlistsorted` on these names prints a0a00 once, not twice."""
    names = expand("a[0,0]a[00,0-10]")
    ours = compress(names, sort=True)
    assert sorted(expand(ours)) == sorted(names)
    assert "-0," not in ours and ours.count("00") == 2
