"""Stage-out against a real S3-compatible server (rclone serve s3, which checks every
signature): the node's scan and send (node/stageout.py run as a program, as the daemon
runs it over SSH), the version recorded, and its promotion home, verified and whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.storage.home import LocalHome
from slurm_burst.core.staging import (
    CorruptOutput,
    Layout,
    Manifest,
    StagingError,
    namespace,
    output_manifest,
)
from slurm_burst.services.staging import Stager
from tests.integration.test_staging import PREFIX
from tests.integration.test_staging import stager as staging_stager
from tests.s3server import S3Server

STAGEOUT = Path(__file__).resolve().parents[2] / "slurm_burst" / "node" / "stageout.py"


def stager(server: S3Server) -> Stager:
    """test_staging's stager, with a place for outputs to land."""
    return staging_stager(server, home=LocalHome())


def node(*args: str) -> dict[str, Any]:
    """node/stageout.py as the daemon runs it: one JSON line, exit 0 with --exit-zero."""
    res = subprocess.run([sys.executable, str(STAGEOUT), "--exit-zero", *args],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def outputs(root: Path) -> dict[str, bytes]:
    files = {
        "ckpt/step-100.pt": os.urandom(200_000),
        "ckpt/latest": b"step-100\n",
        "log/train.log": b"loss 1.0\n" * 1000,
        "empty": b"",
        "run.sh": b"#!/bin/sh\n",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "run.sh").chmod(0o755)
    return files


def sync(st: Stager, out_dir: Path, home: str, cache: Path) -> tuple[Manifest, dict[str, Any]]:
    """One sync as the daemon does it: scan, plan, send, record."""
    scan = node("scan", "--dir", str(out_dir), "--cache", str(cache))
    assert scan["exit"] == 0, scan
    manifest = output_manifest(home, scan["files"], "scan")
    plan, _ = st.output_plan("physics", manifest, str(out_dir))
    plan_file = out_dir.parent / "plan.json"
    plan_file.write_text(json.dumps(plan))
    sent = node("send", "--plan", str(plan_file))
    assert sent["exit"] == 0 and not sent["changed"], sent
    assert not plan_file.exists()  # its URLs are grants: removed once read
    st.commit("physics", manifest)
    return manifest, {"scan": scan, "sent": sent, "plan": plan}


def test_outputs_go_home_verified_whole_and_a_second_sync_sends_only_what_changed(
    server: S3Server, tmp_path: Path
) -> None:
    out_dir = tmp_path / "node" / "42" / "out"
    files = outputs(out_dir)
    # what a job could plant to read root's files or hang the scan: neither is followed
    (out_dir / "shadow").symlink_to("/etc/shadow")
    os.mkfifo(out_dir / "fifo")
    home = str(tmp_path / "results" / "42")
    (tmp_path / "results").mkdir()
    st = stager(server)
    cache = tmp_path / "cache" / "42-out.json"
    manifest, first = sync(st, out_dir, home, cache)
    assert sorted(first["scan"]["skipped"]) == ["fifo", "shadow"]
    assert first["scan"]["hashed_bytes"] == sum(map(len, files.values()))
    assert len(first["plan"]["files"]) == 5 and first["sent"]["sent"] == 5
    assert oct(cache.stat().st_mode & 0o777) == "0o600"

    got = st.promote("physics", manifest.id, home)
    assert (got["files"], got["bytes"], got["atomic"]) == (5, sum(map(len, files.values())), True)
    for rel, data in files.items():
        assert (Path(home) / rel).read_bytes() == data
    assert os.access(Path(home) / "run.sh", os.X_OK)
    assert not (Path(home) / "shadow").exists() and not (Path(home) / "fifo").exists()
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["42"]  # no work dir left

    # the job goes on: one checkpoint more, the log grows; only those are read and sent
    (out_dir / "ckpt" / "step-200.pt").write_bytes(os.urandom(100_000))
    with (out_dir / "log" / "train.log").open("ab") as f:
        f.write(b"loss 0.5\n")
    second, again = sync(st, out_dir, home, cache)
    assert again["scan"]["hashed_bytes"] == 100_000 + 9009
    assert sorted(f["path"] for f in again["plan"]["files"]) == [
        "ckpt/step-200.pt",
        "log/train.log",
    ]
    assert st.manifest("physics", home) == second  # the version a requeued job resumes
    (Path(home) / "ckpt" / "latest").write_text("edited at home\n")  # replaced whole
    st.promote("physics", second.id, home)
    assert (Path(home) / "ckpt" / "step-200.pt").stat().st_size == 100_000
    assert (Path(home) / "ckpt" / "latest").read_bytes() == b"step-100\n"


def test_a_corrupt_object_is_never_promoted_and_what_was_home_stays(
    server: S3Server, tmp_path: Path
) -> None:
    out_dir = tmp_path / "node" / "7" / "out"
    outputs(out_dir)
    home = tmp_path / "results-7"
    home.mkdir()
    (home / "old").write_text("the last good version\n")
    st = stager(server)
    manifest, _ = sync(st, out_dir, str(home), tmp_path / "c.json")
    layout = Layout(PREFIX, namespace("physics"))
    victim = next(e for e in manifest.entries if e.path == "ckpt/step-100.pt")
    stored = server.object_file(layout.object(victim.object_name()))
    body = bytearray(stored.read_bytes())
    body[1000] ^= 0xFF  # one byte flipped in the store, its size the same
    stored.write_bytes(bytes(body))
    with pytest.raises(CorruptOutput, match=r"1 files came back .*ckpt/step-100.pt.*nothing was"):
        st.promote("physics", manifest.id, str(home))
    assert [p.name for p in home.iterdir()] == ["old"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(StagingError, match=r"not .*results-elsewhere"):
        st.promote("physics", manifest.id, str(tmp_path / "results-elsewhere"))


def test_a_file_changed_while_it_is_sent_is_named_and_a_grant_writes_one_object_only(
    server: S3Server, tmp_path: Path
) -> None:
    out_dir = tmp_path / "node" / "9" / "out"
    outputs(out_dir)
    st = stager(server)  # another account: none of the other tests' objects are its
    scan = node("scan", "--dir", str(out_dir))
    manifest = output_manifest(str(tmp_path / "r9"), scan["files"], "scan")
    plan, size = st.output_plan("chem", manifest, str(out_dir))
    assert size == manifest.size and len(plan["files"]) == 5
    (out_dir / "ckpt" / "latest").write_bytes(b"step-999\n")  # same size, other bytes
    (out_dir / "log" / "train.log").unlink()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    sent = node("send", "--plan", str(plan_file))
    assert sorted(sent["changed"]) == ["ckpt/latest", "log/train.log"], sent
    digests = [e.sha256 for e in manifest.entries if e.path in sent["changed"]]
    assert st.drop("chem", "", manifest, digests) == 2
    # a PUT grant is for its own object: the same URL cannot write another key
    url = plan["files"][0]["url"]
    other = url.replace(plan["files"][0]["sha256"], "0" * 64)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(other, data=b"x", method="PUT"))
    assert e.value.code == 403


def test_prepare_makes_the_users_directory_and_refuses_a_planted_one(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("prepare gives the directory to the job's user: needs root")
    job = tmp_path / "stage" / "5"
    got = node("prepare", "--dir", str(job / "ckpt"), "--uid", "65534", "--gid", "65534")
    assert got == {"exit": 0, "made": True, "ok": True}
    st = (job / "ckpt").stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o777)) == (65534, 65534, "0o700")
    assert (
        node("prepare", "--dir", str(job / "ckpt"), "--uid", "65534", "--gid", "65534")["made"]
        is False
    )
    (job / "link").symlink_to(tmp_path)
    said = node("prepare", "--dir", str(job / "link"), "--uid", "65534", "--gid", "65534")
    assert said["exit"] == 2 and "not a directory" in said["error"]
    said = node("scan", "--dir", str(job / "link"))
    assert said["exit"] == 1 and "symlink" in said["error"]
    # a hard link the job made to a file of root's: skipped (as root it could be read)
    (job / "ckpt" / "mine").write_text("mine\n")
    os.chown(job / "ckpt" / "mine", 65534, 65534)
    (job / "roots").write_text("root's secret\n")
    os.link(job / "roots", job / "ckpt" / "hard")
    said = node("scan", "--dir", str(job / "ckpt"), "--uid", "65534")
    assert [f[0] for f in said["files"]] == ["mine"] and said["skipped"] == ["hard"], said
    assert node("scan", "--dir", str(job / "nothing"))["missing"] is True
    assert node("send", "--plan", str(tmp_path / "none.json"))["exit"] == 1


def test_the_daemons_promotion_child_names_the_files_that_came_back_wrong(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the daemon runs to bring a version home (``stage promote --as-user``, in a
    child): a corrupt object is its CorruptOutput again, with the files named, so the
    daemon drops just those and has the held node send them again."""
    import pwd
    import shutil
    import tempfile

    from slurm_burst.adapters.stagepush import CliPusher
    from tests.s3server import KEY, SECRET

    out_dir = tmp_path / "node" / "8" / "out"
    outputs(out_dir)
    results = Path(tempfile.mkdtemp(prefix="sb-results-", dir="/tmp"))  # the user's way in
    results.chmod(0o1777)
    home = results / "8"
    st = stager(server)
    manifest, _ = sync(st, out_dir, str(home), tmp_path / "c8.json")
    victim = next(e for e in manifest.entries if e.path == "log/train.log")
    stored = server.object_file(Layout(PREFIX, namespace("physics")).object(victim.object_name()))
    body = bytearray(stored.read_bytes())
    body[10] ^= 0xFF
    stored.write_bytes(bytes(body))
    conf = tmp_path / "slurm-burst.toml"
    conf.write_text(
        '[cluster]\nname = "c"\ncontroller_host = "h"\ncontroller_addr = "10.0.0.1"\n'
        f'[stores.lab]\nbucket = "{server.bucket}"\nendpoint = "{server.endpoint}"\n'
        f'secure = false\nprefix = "{PREFIX}"\n'
        'credentials = { key_env = "SB_S3_KEY", secret_env = "SB_S3_SECRET" }\n'
        '[staging]\nstore = "lab"\n'
        f'[daemon]\nstate_dir = "{tmp_path}/state"\n'
    )
    conf.chmod(0o600)
    monkeypatch.setenv("SB_S3_KEY", KEY)
    monkeypatch.setenv("SB_S3_SECRET", SECRET)
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    try:
        with pytest.raises(CorruptOutput) as err:
            CliPusher(str(conf)).promote(user, "physics", manifest.id, str(home))
        assert err.value.bad == ["log/train.log"] and err.value.code == "StageOutCorrupt"
        assert not home.exists()  # nothing brought home
    finally:
        shutil.rmtree(results, ignore_errors=True)


def test_what_the_scan_read_is_sent_though_the_job_replaced_or_removed_it_since(
    server: S3Server, tmp_path: Path
) -> None:
    """A checkpoint rewritten by rename (and a file removed) between the scan and the
    send: the scan's pins (hard links by digest, root's) keep the bytes it read, so the
    version is recorded whole however long the daemon's round took. The pins follow the
    files: one version's worth, and a rescan of files that did not change reads none."""
    out_dir = tmp_path / "node" / "11" / "out"
    files = outputs(out_dir)
    cache, pins = tmp_path / "stageout" / "11-out.json", tmp_path / "stageout" / "11-out.pins"
    st = stager(server)
    scan = node("scan", "--dir", str(out_dir), "--cache", str(cache), "--pins", str(pins))
    assert scan["exit"] == 0 and scan["unpinned"] == 0 and not scan["busy"], scan
    assert oct(pins.stat().st_mode & 0o777) == "0o700"
    manifest = output_manifest(str(tmp_path / "r11"), scan["files"], "scan")
    plan, _ = st.output_plan("bio", manifest, str(out_dir))
    (out_dir / "ckpt" / "latest.tmp").write_bytes(b"step-200\n")
    (out_dir / "ckpt" / "latest.tmp").rename(out_dir / "ckpt" / "latest")  # replaced whole
    (out_dir / "log" / "train.log").unlink()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({**plan, "pins": str(pins)}))
    sent = node("send", "--plan", str(plan_file))
    assert sent["exit"] == 0 and sent["changed"] == [] and sent["sent"] == 5, sent
    st.commit("bio", manifest)
    home = tmp_path / "r11"
    home.mkdir()
    st.promote("bio", manifest.id, str(home))
    for rel, data in files.items():
        assert (home / rel).read_bytes() == data  # what the scan read, byte for byte

    again = node("scan", "--dir", str(out_dir), "--cache", str(cache), "--pins", str(pins))
    now = {f[2] for f in again["files"]}
    assert {p.name for p in pins.iterdir()} == now and len(now) == 4  # the old ones let go
    assert again["hashed_bytes"] == len(b"step-200\n")
    (out_dir / "run.sh").write_bytes(b"#!/bin/sh\nexit 1\n")  # in place: same inode
    node("scan", "--dir", str(out_dir), "--cache", str(cache), "--pins", str(pins))
    still = node("scan", "--dir", str(out_dir), "--cache", str(cache), "--pins", str(pins))
    assert still["hashed_bytes"] == 0, still  # pinning and unpinning left the keys true

    # a pin directory others could write, or a symlink in its place, is not used
    pins.chmod(0o770)
    bad = node("scan", "--dir", str(out_dir), "--cache", str(cache), "--pins", str(pins))
    assert bad["exit"] == 1 and "not a directory of root's alone" in bad["error"], bad
    pins.chmod(0o700)
    pins.rename(tmp_path / "elsewhere")
    pins.symlink_to(tmp_path / "elsewhere")
    bad = node("scan", "--dir", str(out_dir), "--cache", str(cache), "--pins", str(pins))
    assert bad["exit"] == 1 and "a symlink, or not a directory" in bad["error"], bad
