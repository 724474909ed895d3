"""Data kept home stays home, whatever its spelling (hardening round three, class 1).

A site's kept path is reached through symlinks (``/data -> /mnt/data``, the commonest
layout there is, and a link to a directory above it), and a kept account or QOS is
written in any case; Slurm and the filesystem treat every such spelling as the same
thing, so must we. Generated: a kept path configured in one spelling and a job's
source in another, an account or QOS in another case or with a byte that makes it no
name. For each, the daemon's check (``Stager.push`` against a real S3 server) refuses
before a byte leaves, and the rendered burst_buffer.lua, run by a real Lua 5.1 with
the paths ``conf render`` finds on this host, refuses the job at submit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_burst.config import Config, load_config
from slurm_burst.core.staging import KeptHome, SensitiveData, StagingError
from slurm_burst.services.slurmconf import render
from slurm_burst.wiring.storage import kept_paths
from tests.conftest import examples
from tests.integration.test_staging import stager, tree
from tests.s3server import S3Server
from tests.unit.test_burst_buffer_lua import HARNESS, LUA
from tests.unit.test_config import GOOD, write

pytestmark = pytest.mark.skipif(LUA is None, reason="needs lua5.1 (make test installs it)")


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    """base/mnt/data (the real directory, a dataset in it), base/data -> mnt/data,
    base/d -> mnt, base/alias -> data (a link to a link), base/public (open data)."""
    base = Path(tempfile.mkdtemp(prefix="kept", dir="/var/tmp"))
    tree(base / "mnt" / "data" / "scans")
    tree(base / "public")
    (base / "data").symlink_to(base / "mnt" / "data")
    (base / "d").symlink_to(base / "mnt")
    (base / "alias").symlink_to(base / "data")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def spellings(base: Path) -> list[str]:
    return [f"{base}/mnt/data", f"{base}/data", f"{base}/d/data", f"{base}/alias"]


_scripts: dict[str, Path] = {}


def lua_script(base: Path, kept: str) -> Path:
    """burst_buffer.lua rendered as `conf render` renders it here, for a config that
    keeps ``kept`` (and account hospital, QOS Secret) home."""
    if kept not in _scripts:
        work = Path(tempfile.mkdtemp(dir=base))
        text = (
            GOOD.replace("[slurm]\n", f'[slurm]\nhook_dir = "{work}/bin"\n')
            + f"""
[stores.s3]
bucket = "bucket-1"
region = "eu-west-1"
credentials = {{ key_env = "K", secret_env = "S" }}

[staging]
store = "s3"
onprem_only_paths = ["{kept}"]

[policy.accounts.hospital]
onprem_only = true

[policy.qos.Secret]
onprem_only = true
"""
        )
        cfg: Config = load_config(write(work, text))
        path = work / "burst_buffer.lua"
        path.write_text(render(cfg, "24.11", kept_paths(cfg))["burst_buffer.lua"])
        _scripts[kept] = path
    return _scripts[kept]


def submit(script: Path, src: str, account: str, qos: str) -> str:
    """job_process (24.11's arguments) on a burst-only job staging ``src``."""
    assert LUA is not None
    with tempfile.NamedTemporaryFile("wb", suffix=".batch") as batch:
        job = f"#!/bin/sh\n#BB_LUA stage_in src={src} dst=x\n".encode("utf-8", "surrogateescape")
        batch.write(job + b"\0")
        batch.flush()
        done = subprocess.run(
            [LUA, str(HARNESS), str(script), "process", batch.name, "burst-gpu", account, qos],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.decode("utf-8", "replace").strip()


def respell_case(data: st.DataObject, name: str) -> str:
    flips = data.draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.swapcase() if f else c for c, f in zip(name, flips, strict=True))


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_every_spelling_of_a_kept_path_stays_home(
    site: Path, server: S3Server, data: st.DataObject
) -> None:
    kept = data.draw(st.sampled_from(spellings(site)), label="kept as configured")
    src = data.draw(st.sampled_from(spellings(site)), label="the job's spelling")
    src += data.draw(st.sampled_from(["", "/scans", "/scans/a", "/scans/a/b"]), label="below")
    before = server.objects()
    with pytest.raises(SensitiveData, match="stays on-prem"):
        stager(server, kept=KeptHome(paths=(kept,))).push(src, "physics", "")
    assert server.objects() == before, "a byte of kept data reached the store"
    said = submit(lua_script(site, kept), src, "physics", "normal")
    assert said.startswith("-1 ") and "stays on-prem" in said, (kept, src, said)


NAMES = st.sampled_from([("account", "hospital"), ("qos", "secret")])


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data(), which=NAMES)
def test_every_spelling_of_a_kept_name_stays_home(
    site: Path, server: S3Server, data: st.DataObject, which: tuple[str, str]
) -> None:
    kind, name = which
    spelled = respell_case(data, name)
    broken = data.draw(st.sampled_from(["", "", "\n", "\r", "\x7f", " ", "\t", "\u00a0", "é"]))
    spelled += broken
    account, qos = (spelled, "normal") if kind == "account" else ("physics", spelled)
    public = str(site / "public")
    rules = KeptHome(accounts=frozenset({"hospital"}), qos=frozenset({"Secret"}))
    before = server.objects()
    # a broken account is no namespace either: refused as such, before the rules
    refused = StagingError if broken and kind == "account" else SensitiveData
    with pytest.raises(refused):
        stager(server, kept=rules).push(public, account, qos)
    assert server.objects() == before, "a byte of kept data reached the store"
    said = submit(lua_script(site, f"{site}/mnt/data"), public, account, qos)
    assert said.startswith("-1 "), (account, qos, said)
    assert ("keeps its data on-prem" if not broken else "is not a Slurm") in said, said


def test_open_data_and_names_still_leave(site: Path, server: S3Server) -> None:
    """The rules refuse what they should and nothing more: a public path, an ordinary
    account and QOS pass in Python and in Lua alike."""
    rules = KeptHome(paths=(f"{site}/data",), accounts=frozenset({"hospital"}),
                     qos=frozenset({"secret"}))  # fmt: skip
    pushed = stager(server, kept=rules).push(str(site / "public"), "Physics", "Normal")
    assert pushed.files > 0
    assert submit(lua_script(site, f"{site}/data"), str(site / "public"), "Physics", "") == "0"
    assert os.path.realpath(site / "alias") == str(site / "mnt" / "data")


def test_conf_render_writes_every_spelling_it_finds(site: Path) -> None:
    text = lua_script(site, f"{site}/mnt/data").read_text()
    table = re.sub(r"\\([0-9]{3})", lambda m: chr(int(m.group(1))), text)  # Lua's escapes
    for spelling in spellings(site):
        assert f'"{spelling}"' in table, spelling
