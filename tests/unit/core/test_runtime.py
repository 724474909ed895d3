"""The runtime manifest's comparison, rule by rule and field class by field class, and
its reader against malformed and hostile documents."""

from __future__ import annotations

import re
from typing import Any

import pytest

from slurm_burst.core.runtime import (
    Manifest,
    ManifestError,
    compare,
    from_document,
    mismatches,
    to_document,
)

LIB = "libnccl.so.2.19.3 " + "a" * 64
LIB_REBUILT = "libnccl.so.2.19.3 " + "b" * 64
REFERENCE = {
    "os": "debian 12",
    "kernel": "6.1.0-18-amd64",
    "glibc": "2.36",
    "driver": "550.54.15",
    "cuda_driver": "12.4",
    "cuda_runtime": "12.4",
    "nccl": "2.19.3",
    "mpi": "openmpi 4.1.4",
    "python": "3.11.2",
    "library:libnccl.so.2": LIB,
    "package:torch": "2.3.0",
    "image:pytorch": "sha256:" + "1" * 64,
}

# (field, the node's value, passes 'compatible'): every field class, each way
CASES = [
    ("os", "debian 13", False),
    ("os", "ubuntu 12", False),
    ("kernel", "6.1.0-21-amd64", True),
    ("kernel", "6.6.15-amd64", False),
    ("glibc", "2.41", True),
    ("glibc", "2.31", False),
    ("glibc", "3.0", False),
    ("driver", "555.42.02", True),
    ("driver", "535.104.05", False),
    ("driver", "", False),
    ("cuda_driver", "12.5", True),
    ("cuda_driver", "12.2", False),
    ("cuda_runtime", "12.6", True),
    ("cuda_runtime", "12.2", False),
    ("cuda_runtime", "13.0", False),
    ("nccl", "2.19.4", True),
    ("nccl", "2.20.3", False),
    ("mpi", "openmpi 4.1.6", True),
    ("mpi", "openmpi 5.0.7", False),
    ("mpi", "mpich 4.1.4", False),
    ("python", "3.11.9", True),
    ("python", "3.12.2", False),
    ("library:libnccl.so.2", LIB_REBUILT, True),
    ("library:libnccl.so.2", "libnccl.so.2.20.3 " + "a" * 64, False),
    ("library:libnccl.so.2", "", False),
    ("package:torch", "2.3.1", False),
    ("image:pytorch", "sha256:" + "2" * 64, False),
    ("driver", "not-a-version", False),
]


def node_with(field: str, value: str) -> Manifest:
    return Manifest({**REFERENCE, field: value}, source="node")


@pytest.mark.parametrize(("field", "value", "compatible"), CASES, ids=lambda v: str(v)[:24])
def test_each_field_class_is_judged_by_its_rule(field: str, value: str, compatible: bool) -> None:
    ref = Manifest(dict(REFERENCE))
    node = node_with(field, value)
    for rule, passes in (("compatible", compatible), ("exact", False)):
        diffs = compare(ref, node, rule)
        assert [d.field for d in diffs] == [field], rule
        assert diffs[0].ok is passes, (rule, diffs[0])
        assert (mismatches(diffs) == []) is passes


def test_an_equal_node_has_no_difference_and_a_missing_field_is_one() -> None:
    ref = Manifest(dict(REFERENCE))
    assert compare(ref, Manifest(dict(REFERENCE)), "exact") == []
    partial = Manifest({k: v for k, v in REFERENCE.items() if k != "nccl"}, source="node")
    (d,) = compare(ref, partial, "compatible")
    assert (d.field, d.ok, d.why) == ("nccl", False, "not captured on the node")


def test_an_image_is_not_asked_for_what_only_a_running_node_has() -> None:
    image = Manifest(
        {k: v for k, v in REFERENCE.items() if k not in ("kernel", "driver", "cuda_driver")},
        source="image /srv/img",
    )
    diffs = compare(Manifest(dict(REFERENCE)), image, "exact")
    assert {d.field for d in diffs} == {"kernel", "driver", "cuda_driver"}
    assert mismatches(diffs) == []


def test_what_only_the_node_has_passes_only_when_compatible() -> None:
    node = Manifest({**REFERENCE, "package:extra": "1.0"}, source="node")
    ref = Manifest(dict(REFERENCE))
    assert mismatches(compare(ref, node, "compatible")) == []
    assert [d.field for d in mismatches(compare(ref, node, "exact"))] == ["package:extra"]


def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="must be one of exact, compatible"):
        compare(Manifest({}), Manifest({}), "close-enough")


def test_a_manifest_goes_through_its_document_unchanged() -> None:
    m = Manifest(dict(REFERENCE), host="op1", captured_at="2026-11-30T12:00:00Z",
                 source="node", python_path="/usr/bin/python3")  # fmt: skip
    assert from_document(to_document(m), "here") == m


GOOD: dict[str, Any] = {"slurm_burst_runtime": 1, "os": "debian 12"}
BAD = [
    ([], "not a runtime manifest"),
    ({"os": "debian 12"}, "slurm_burst_runtime is None"),
    ({**GOOD, "slurm_burst_runtime": 2}, "schema 1"),
    ({**GOOD, "colour": "blue"}, "unknown field 'colour'"),
    ({**GOOD, "os": 12}, "os: must be text, not int"),
    ({**GOOD, "os": "debian\n12"}, "printable"),
    ({**GOOD, "os": "x" * 513}, "at most 512"),
    ({**GOOD, "packages": ["torch"]}, "packages must be an object"),
    ({**GOOD, "packages": {"../../etc": "1"}}, "bad name"),
    ({**GOOD, "packages": {"torch": None}}, "must be text, not NoneType"),
    ({**GOOD, "images": {"pytorch": "latest"}}, "must be a digest"),
    ({**GOOD, "libraries": {"libc.so.6": "libc.so.6 notahash"}}, "'<file> <sha256 hex>'"),
    ({**GOOD, "packages": {f"p{i}": "1" for i in range(5000)}}, "over 4,096"),
    ({**GOOD, "python_path": "python3; rm -rf /"}, "python_path must be an absolute path"),
]


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_document_is_refused_saying_which_field(doc: Any, message: str) -> None:
    with pytest.raises(ManifestError, match="^ref.json: .*" + re.escape(message)):
        from_document(doc, "ref.json")
