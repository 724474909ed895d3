"""``slurm-burst runtime``: the capture program on this host and on an image's files
(links followed inside the image, never out of it; dpkg's records; dist-info
directories), ``runtime diff`` between captured manifests, a group's reference and a
node's kept manifest, and what it says of sources that do not read."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from slurm_burst.node import runtime as node_runtime
from slurm_burst.runtimeref import keep_node_manifest
from tests.conftest import invoke, lab_config_in

LIBDIR = "usr/lib/x86_64-linux-gnu"
DPKG = """Package: libopenmpi3
Status: purge ok not-installed
Version: 4.1.4-3

Package: libopenmpi40
Status: install ok installed
Version: 4.1.6-13.3

Package: python3.12
Status: install ok installed
Version: 3.12.3-1+b1

Package: libmpich12
Status: deinstall ok config-files
Version: 4.0.2-3
"""


def image(tmp_path: Path) -> Path:
    """An unpacked image's files: what the capture reads of one."""
    root = tmp_path / "image"
    lib = root / LIBDIR
    lib.mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text('PRETTY_NAME="Debian"\nID=debian\nVERSION_ID="13"\n')
    (lib / "libc.so.6").write_bytes(b"\x7fELF...GNU C Library stable release version 2.41.\n\0")
    (lib / "libnccl.so.2.19.3").write_bytes(b"nccl")
    os.symlink("libnccl.so.2.19.3", lib / "libnccl.so.2")
    (lib / "libcudart.so.12.4.127").write_bytes(b"cudart")
    os.symlink("libcudart.so.12.4.127", lib / "libcudart.so.12")
    os.symlink(f"/{LIBDIR}/libnccl.so.2.19.3", lib / "libabs.so.1")  # absolute: in the image
    os.symlink("/etc/hostname", lib / "libescape.so.1")  # the host's file: never read
    os.symlink("libloop.so.1", lib / "libloop.so.1")
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(DPKG)
    (root / "usr/bin").mkdir()
    (root / "usr/bin/python3.12").write_bytes(b"")
    os.symlink("python3.12", root / "usr/bin/python3")
    site = root / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True)
    (site / "numpy-2.2.4.dist-info").mkdir()
    (site / "mpi4py-4.0.3.egg-info").mkdir()
    return root


def test_an_images_files_give_its_runtime_and_no_link_leads_out_of_it(tmp_path: Path) -> None:
    root = image(tmp_path)
    out = tmp_path / "image.json"
    args = ["runtime", "capture", "--root", str(root), "--out", str(out)]
    for lib in ("libnccl.so.2", "libabs.so.1", "libescape.so.1", "libloop.so.1", "libnone.so"):
        args += ["--library", lib]
    invoke([*args, "--package", "numpy", "--package", "MPI4PY", "--package", "torch"])
    doc = json.loads(out.read_text())
    nccl = f"libnccl.so.2.19.3 {hashlib.sha256(b'nccl').hexdigest()}"
    assert {k: doc.get(k) for k in ("os", "glibc", "nccl", "cuda_runtime", "mpi", "python")} == {
        "os": "debian 13", "glibc": "2.41", "nccl": "2.19.3", "cuda_runtime": "12.4",
        "mpi": "openmpi 4.1.6", "python": "3.12.3",
    }  # fmt: skip
    assert "kernel" not in doc and "driver" not in doc  # an image has none
    assert doc["libraries"] == {
        "libnccl.so.2": nccl, "libabs.so.1": nccl,
        "libescape.so.1": "", "libloop.so.1": "", "libnone.so": "",
    }  # fmt: skip
    assert doc["packages"] == {"numpy": "2.2.4", "MPI4PY": "4.0.3", "torch": ""}
    assert doc["source"] == f"image {root}"


def test_this_host_captured_twice_has_the_same_runtime(tmp_path: Path) -> None:
    ref = tmp_path / "ref.json"
    invoke(["runtime", "capture", "--package", "click", "--library", "libc.so.6",
            "--out", str(ref)])  # fmt: skip
    doc = json.loads(ref.read_text())
    assert doc["kernel"] == os.uname().release
    assert doc["glibc"] == str(os.confstr("CS_GNU_LIBC_VERSION")).split()[1]
    assert doc["libraries"]["libc.so.6"].startswith("libc.so.6 ")
    said = invoke(["runtime", "diff", str(ref), "here"]).stdout
    assert "fields equal" in said
    said = invoke(["runtime", "diff", str(ref), "here", "--all", "--json"]).stdout
    got = json.loads(said)
    assert got["mismatches"] == 0 and {d["field"] for d in got["differences"]} >= {
        "kernel", "glibc", "library:libc.so.6", "package:click",
    }  # fmt: skip


def test_diff_says_what_differs_and_exits_1_beyond_the_rule(tmp_path: Path) -> None:
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"slurm_burst_runtime": 1, "os": "debian 12", "glibc": "2.36",
                               "mpi": "openmpi 4.1.4"}))  # fmt: skip
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"slurm_burst_runtime": 1, "os": "debian 12", "glibc": "2.41",
                                 "mpi": "openmpi 4.1.6"}))  # fmt: skip
    said = json.loads(invoke(["runtime", "diff", str(ref), str(newer), "--json"]).stdout)
    assert said["mismatches"] == 0 and [d["field"] for d in said["differences"]] == [
        "glibc", "mpi",
    ]  # fmt: skip
    exact = invoke(["runtime", "diff", str(ref), str(newer), "--rule", "exact", "--json"], 1)
    assert json.loads(exact.stdout)["mismatches"] == 2
    table = invoke(["runtime", "diff", str(ref), f"image:{image(tmp_path)}"], 1)
    assert "MISMATCH" in table.stdout and "debian 13" in table.stdout
    assert "differ beyond 'compatible'" in table.stderr


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"\xff\xfe garbage", "not JSON"),
        (b'{"slurm_burst_runtime": 1, "os": NaN}', "NaN is not a JSON number"),
        (b"[" * 100 + b"]" * 100, "nested deeper"),
        (b'{"slurm_burst_runtime": 1, "kernel": {"a": 1}}', "kernel: must be text"),
        (b" " * (5 * 1024 * 1024), "over the limit"),
    ],
    ids=["bytes", "nan", "deep", "type", "huge"],
)
def test_a_source_that_does_not_read_is_exit_2_with_the_reason(
    tmp_path: Path, body: bytes, said: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(body)
    out = invoke(["runtime", "diff", str(bad), "here"], 2)
    assert said in out.stderr and "Traceback" not in out.stderr + out.stdout
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in invoke(["runtime", "diff", str(fifo), "here"], 2).stderr


def test_a_groups_reference_and_a_nodes_kept_manifest(tmp_path: Path) -> None:
    ref = tmp_path / "onprem.json"
    ref.write_text(json.dumps({"slurm_burst_runtime": 1, "os": "debian 12"}))
    ref.chmod(0o644)
    lab_ref = f'runtime_manifest = "{tmp_path}/lab/runtime/onprem.json"'
    edit = (lab_ref, f'runtime_manifest = "{ref}"')
    cfg = lab_config_in(tmp_path, edits=[edit, edit])  # groups direct and train
    keep_node_manifest(cfg.daemon.state_dir, "burst-train-1",
                       b'{"slurm_burst_runtime": 1, "os": "debian 13"}')  # fmt: skip
    args = ["--config", cfg.source, "runtime", "diff", "group:train", "node:burst-train-1"]
    out = invoke([*args, "--json"], 1)
    assert json.loads(out.stdout)["differences"][0]["other"] == "debian 13"
    no_node = invoke([*args[:-1], "node:burst-train-2"], 2)
    assert "no runtime manifest kept for burst-train-2" in no_node.stderr
    assert "is not a node name" in invoke([*args[:-1], "node:../../etc"], 2).stderr
    keep_node_manifest(cfg.daemon.state_dir, "gpu.a-1", b'{"slurm_burst_runtime": 1}')
    assert json.loads(invoke([*args[:-1], "node:gpu.a-1", "--json"], 1).stdout)["mismatches"] == 1
    assert "names no runtime_manifest" in invoke([*args[:-2], "group:cpu", "here"], 2).stderr


def test_the_capture_program_refuses_bad_usage_without_a_traceback(tmp_path: Path) -> None:
    assert node_runtime.main(["capture", "--root", str(tmp_path / "none")]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert node_runtime.main(["capture", "--like", str(bad)]) == 2
