"""core.staging: directives, paths, manifests, pointers, what stays home."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_burst.adapters.storage.sigv4 import presign
from slurm_burst.core.staging import (
    Entry,
    KeptHome,
    Layout,
    Manifest,
    StageIn,
    StageOut,
    StagingError,
    check_relpath,
    kept_home,
    namespace,
    parse_manifest,
    parse_pointer,
    parse_stages,
    pointer_body,
    stage_env,
    to_send,
    worth_compressing,
)
from tests.conftest import examples

SHA = "ab" * 32


@pytest.mark.parametrize(
    ("script", "want"),
    [
        ("#!/bin/bash\n#BB_LUA stage_in src=/data/imagenet dst=imagenet\nsrun x\n",
         [StageIn("/data/imagenet", "imagenet", 2)]),
        ("#!/bin/bash\n#SBATCH -p burst-gpu\n#BB_LUA stage_in dst=a src=/d/a\n"
         "#BB_LUA  stage_in\tsrc=/d/b dst=b.v2\n",
         [StageIn("/d/a", "a", 3), StageIn("/d/b", "b.v2", 4)]),
        ("#!/bin/sh\necho hi\n#BB_LUA stage_in src=/d/a dst=a\n", []),  # after the header
        ("#!/bin/sh\n# BB_LUA stage_in src=/d dst=a\n\n #BB_LUA stage_in src=/d dst=a\n", []),
    ],
    ids=["one", "two-and-sbatch", "after-header", "not-the-directive"],
)  # fmt: skip
def test_directives_are_read_from_the_header(script: str, want: list[StageIn]) -> None:
    assert list(parse_stages(script).ins) == want


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("#BB_LUA", "nothing after"),
        ("#BB_LUAX stage_in src=/a dst=b", "is not #BB_LUA"),
        ("#BB_LUA stage_up src=/a dst=b", "not a stage"),
        ("#BB_LUA stage_out src=/a dst=/b", "src='/a': a name of"),
        ("#BB_LUA stage_out src=a dst=b", "absolute path"),
        ("#BB_LUA stage_out src=a dst=/", "replaces its destination"),
        ("#BB_LUA stage_out src=a dst=/r/%a", "absolute path"),
        ("#BB_LUA stage_out src=a dst=/r sync=5", r"sync='5': 0 \(at the end only\) or 10"),
        ("#BB_LUA stage_out src=a dst=/r sync=1e3", "sync="),
        ("#BB_LUA stage_out src=a dst=/r sync=604801", "sync="),
        ("#BB_LUA stage_in src=/a dst=sync sync=10", "stage_in takes src=PATH"),
        ("#BB_LUA stage_out src=a", "needs dst="),
        ("#BB_LUA stage_in src=/a dst=b\n#BB_LUA stage_out src=b dst=/c", "also line 2"),
        ("#BB_LUA stage_in src=/a", "needs dst="),
        ("#BB_LUA stage_in src=/a dst=b dst=c", "given twice"),
        ("#BB_LUA stage_in src=/a dst=b extra=1", "takes src=PATH"),
        ("#BB_LUA stage_in src=relative dst=b", "absolute path"),
        ("#BB_LUA stage_in src=/a/../etc dst=b", "normalized"),
        ("#BB_LUA stage_in src=/a dst=../b", "a name of"),
        ("#BB_LUA stage_in src=/a;rm dst=b", "absolute path"),
        ("#BB_LUA stage_in src=/a dst=b\n#BB_LUA stage_in src=/c dst=b", "also line 2"),
    ],
)
def test_a_bad_directive_names_its_line_and_what_is_wrong(line: str, says: str) -> None:
    with pytest.raises(StagingError, match=says) as e:
        parse_stages("#!/bin/sh\n" + line + "\n")
    assert "line " in str(e.value)


def test_stage_outs_are_read_with_the_stage_ins_and_name_their_home() -> None:
    got = parse_stages(
        "#!/bin/sh\n#BB_LUA stage_out src=ckpt dst=/results/%j/ckpt sync=600\n"
        "#BB_LUA stage_in src=/d/a dst=a\n#BB_LUA stage_out src=out dst=/r/%j-%j\n"
    )
    assert got.ins == (StageIn("/d/a", "a", 3),)
    assert got.outs == (
        StageOut("ckpt", "/results/%j/ckpt", 600, 2),
        StageOut("out", "/r/%j-%j", 0, 4),
    )
    assert [o.home(77) for o in got.outs] == ["/results/77/ckpt", "/r/77-77"]
    assert parse_stages("#BB_LUA stage_out src=o dst=/r\n").ins == ()


@pytest.mark.parametrize("path", ["", "/a", "a//b", "a/./b", "a/..", "a/" + "x" * 256, "a\nb"])
def test_a_path_a_node_must_not_create_is_refused(path: str) -> None:
    with pytest.raises(StagingError):
        check_relpath(path, "here")


def entries() -> list[Entry]:
    return [Entry("b/2", 5, "cd" * 32), Entry("a", 3, SHA, True), Entry("c", 3, SHA, False, "zlib")]


def test_a_manifest_is_canonical_its_id_is_its_digest_and_it_reads_back_the_same() -> None:
    m = Manifest.build("/data/x", entries())
    assert [e.path for e in m.entries] == ["a", "b/2", "c"]
    assert Manifest.build("/data/x", reversed(entries())).id == m.id
    back = parse_manifest(m.body, "m")
    assert back == m and back.id == m.id
    assert set(m.objects()) == {f"o/ab/{SHA}", f"o/ab/{SHA}.z", f"o/cd/{'cd' * 32}"}
    assert m.size == 11


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d["files"][0].__setitem__(0, "../x"),
        lambda d: d["files"][0].__setitem__(1, -1),
        lambda d: d["files"][0].__setitem__(2, "AB" * 32),
        lambda d: d["files"][0].__setitem__(4, "gzip"),
        lambda d: d["files"].append(list(d["files"][0])),
        lambda d: d.__setitem__("v", 2),
        lambda d: d.__setitem__("src", "relative"),
    ],
    ids=["path", "size", "digest", "encoding", "twice", "version", "src"],
)
def test_a_tampered_manifest_is_refused(tamper: object) -> None:
    doc = json.loads(Manifest.build("/data/x", entries()).body)
    tamper(doc)  # type: ignore[operator]
    with pytest.raises(StagingError):
        parse_manifest(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode(), "m")


def test_a_manifest_not_in_canonical_form_is_refused() -> None:
    body = Manifest.build("/data/x", entries()).body
    with pytest.raises(StagingError, match="canonical"):
        parse_manifest(json.dumps(json.loads(body), indent=1).encode(), "m")


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_garbage_is_a_staging_error_never_another(body: bytes) -> None:
    for parse in (parse_manifest, parse_pointer):
        with contextlib.suppress(StagingError):
            parse(body, "store")


def test_a_file_and_a_directory_of_one_name_is_refused() -> None:
    with pytest.raises(StagingError, match="a file and a directory"):
        Manifest.build("/d", [Entry("a", 1, SHA), Entry("a/b", 1, SHA)])


def test_only_objects_not_stored_are_sent_each_once_largest_first() -> None:
    m = Manifest.build("/d", [Entry("x", 1, SHA), Entry("y", 1, SHA), Entry("z", 9, "cd" * 32)])
    assert [e.path for e in to_send(m, [])] == ["z", "x"]
    assert [e.path for e in to_send(m, [f"o/cd/{'cd' * 32}"])] == ["x"]


def test_namespaces_and_layout() -> None:
    assert namespace("Physics") == "acct-physics"
    for bad in ("", "a b", "../x", "x" * 64):
        with pytest.raises(StagingError):
            namespace(bad)
    lay = Layout("sb/", "acct-physics")
    assert lay.manifest("f" * 64) == f"sb/acct-physics/m/{'f' * 64}.json"
    assert lay.pointer("/d") != Layout("sb/", "acct-chem").pointer("/d")


def test_a_pointer_reads_back() -> None:
    m = Manifest.build("/d", entries())
    p = parse_pointer(pointer_body("/d", m, 1700000000.5), "p")
    assert (p.src, p.manifest, p.files, p.bytes) == ("/d", m.id, 3, 11)


@pytest.mark.parametrize(
    ("src", "account", "qos", "kept"),
    [
        ("/data/med", "physics", "", True),
        ("/data/med/x/y", "physics", "", True),
        ("/data/medical", "physics", "", False),  # a prefix of a name is not the directory
        ("/data/open", "MedGen", "", True),
        ("/data/open", "physics", "hipaa", True),
        ("/data/open", "physics", "normal", False),
    ],
)
def test_what_stays_home(src: str, account: str, qos: str, kept: bool) -> None:
    rules = KeptHome(paths=("/data/med",), accounts=frozenset({"medgen"}), qos=frozenset({"hipaa"}))
    assert (kept_home(src, account, qos, rules) is not None) == kept


def test_compression_pays_only_for_a_tenth_off_and_not_for_small_files() -> None:
    assert worth_compressing(10_000, 1000, 899)
    assert not worth_compressing(10_000, 1000, 950)
    assert not worth_compressing(100, 100, 10)


def test_the_jobs_environment_names_each_stage() -> None:
    env = stage_env([StageIn("/d/a", "image-net.v2")], "/stage/42")
    assert env == {"SLURM_BURST_STAGE": "/stage/42",
                   "SLURM_BURST_STAGE_IMAGE_NET_V2": "/stage/42/image-net.v2"}  # fmt: skip


def test_presigned_urls_match_aws_documented_example() -> None:
    """AWS's Signature Version 4 query-string example (GET /test.txt, 2013-05-24)."""
    url = presign(
        "GET", "https://examplebucket.s3.amazonaws.com", "/test.txt", region="us-east-1",
        key="AKIAIOSFODNN7EXAMPLE", secret="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        seconds=86400, now=1369353600,
    )  # fmt: skip
    assert url.endswith(
        "X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    )
    for bad in (0, 7 * 86400 + 1):
        with pytest.raises(ValueError):
            presign("GET", "http://h", "/b/k", region="r", key="k", secret="s", seconds=bad)
