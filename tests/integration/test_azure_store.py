"""The same staging on Azure Blob Storage, against Azurite (Microsoft's emulator, which
checks every Shared Key signature and SAS token): a push and a node's pull through SAS
grants, stage-out's scan and send through write-only SAS and its promotion home, the
grants' limits, a large write in blocks, and stage gc reading Azure's listing dates."""

from __future__ import annotations

import io
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.clock import SystemClock
from slurm_burst.adapters.storage.azure import AzureBlobStore
from slurm_burst.adapters.storage.home import LocalHome
from slurm_burst.adapters.storage.tree import LocalTree
from slurm_burst.core.staging import CorruptOutput, Layout, StorageError, namespace, output_manifest
from slurm_burst.services.staging import Stager, StagingSettings
from tests.azurite import ACCOUNT, ACCOUNT_KEY, Azurite, azurite, azurite_server
from tests.integration.test_stageout import node, outputs
from tests.integration.test_staging import pull, tree

pytestmark = pytest.mark.skipif(
    azurite() is None, reason="needs Azurite (npm install -g azurite; make test installs it)"
)
PREFIX = "sb/"


@pytest.fixture(scope="module")
def az(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    with azurite_server(tmp_path_factory.mktemp("azurite")) as a:
        yield a


def store(az: Azurite, key: str = ACCOUNT_KEY) -> AzureBlobStore:
    return AzureBlobStore("az", container=az.container, keys={"key": ACCOUNT, "secret": key},
                          endpoint=az.endpoint, secure=False)  # fmt: skip


def stager(az: Azurite, **kw: Any) -> Stager:
    return Stager(settings=StagingSettings(prefix=PREFIX, transfers=4, grant_seconds=300),
                  store=kw.pop("store", None) or store(az), tree=LocalTree(),
                  clock=SystemClock(), home=LocalHome(), **kw)  # fmt: skip


def test_a_push_and_a_nodes_pull_through_sas_grants(az: Azurite, tmp_path: Path) -> None:
    root = tmp_path / "data" / "set1"
    files = tree(root)
    st = stager(az)
    first = st.push(str(root), "physics")
    assert (first.files, first.objects_sent) == (6, 5)
    again = st.push(str(root), "physics")
    assert again.unchanged and again.bytes_sent == 0
    manifest = st.manifest("physics", str(root))
    assert manifest is not None
    uid = os.geteuid()
    dest = tmp_path / "node" / "job1" / "set1"
    plan = st.node_plan("physics", manifest, str(dest), uid, uid)
    assert all("sig=" in f["url"] and "sp=r&" in f["url"] for f in plan["files"])
    assert all(ACCOUNT_KEY not in f["url"] for f in plan["files"])
    code, out = pull(plan)
    assert code == 0 and out["files"] == 6, out
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data


def test_outputs_go_home_through_write_only_grants_and_a_bad_blob_is_never_promoted(
    az: Azurite, tmp_path: Path
) -> None:
    out_dir = tmp_path / "node" / "42" / "out"
    files = outputs(out_dir)
    home = tmp_path / "results-42"
    st = stager(az)
    scan = node("scan", "--dir", str(out_dir))
    manifest = output_manifest(str(home), scan["files"], "scan")
    plan, _ = st.output_plan("bio", manifest, str(out_dir))
    assert plan["headers"] == {"x-ms-blob-type": "BlockBlob", "x-ms-version": "2020-10-02"}
    assert all("sp=wc&" in f["url"] for f in plan["files"])
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    sent = node("send", "--plan", str(tmp_path / "plan.json"))
    assert sent["exit"] == 0 and sent["sent"] == 5 and not sent["changed"], sent
    st.commit("bio", manifest)
    got = st.promote("bio", manifest.id, str(home))
    assert got["files"] == 5
    for rel, data in files.items():
        assert (home / rel).read_bytes() == data
    # one blob overwritten with other bytes of the same length: never promoted
    layout = Layout(PREFIX, namespace("bio"))
    victim = next(e for e in manifest.entries if e.path == "ckpt/step-100.pt")
    st.store.write_bytes(layout.object(victim.object_name()), os.urandom(victim.size))
    (home / "ckpt" / "latest").write_text("what was home\n")
    with pytest.raises(CorruptOutput, match=r"ckpt/step-100\.pt"):
        st.promote("bio", manifest.id, str(home))
    assert (home / "ckpt" / "latest").read_text() == "what was home\n"


def test_a_grant_is_for_its_blob_its_method_and_its_time(az: Azurite) -> None:
    s = store(az)
    s.write_bytes("sb/a", b"mine")
    put = s.grant("sb/b", 300, "PUT")
    headers = dict(s.upload_headers)

    def status(url: str, method: str = "GET", data: bytes | None = None) -> int:
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status(put, "PUT", b"ok") == 201
    assert status(put.replace("/sb/b?", "/sb/a?"), "PUT", b"overwrite") == 403  # other blob
    assert status(put) == 403  # a write grant does not read
    read = s.grant("sb/a", 300)
    assert status(read, "PUT", b"x") == 403  # a read grant does not write
    assert status(read.replace("sig=", "sig=A")) == 403  # altered
    soon = s.grant("sb/a", 1)
    time.sleep(2.5)
    assert status(soon) == 403  # expired
    with pytest.raises(StorageError) as e:
        store(az, key="d3Jvbmcga2V5").has("sb/a")  # a wrong key
    assert e.value.code == "AccessDenied"
    with pytest.raises(StorageError, match="not base64"):
        store(az, key="not base64!")


def test_a_large_write_goes_in_blocks_and_reads_back_whole(az: Azurite) -> None:
    s = store(az)
    s.single_put_max = 1 << 20  # blocks from 1 MiB here (Azure's limit is 256 MiB)
    body = os.urandom(3 * (1 << 20) + 17)
    assert s.write("sb/big", io.BytesIO(body), len(body)) == len(body)
    got = bytearray()
    assert s.read_into("sb/big", got.extend) == len(body) and bytes(got) == body
    assert s.read_into("sb/none", got.extend) is None


def test_gc_reads_azures_listing_dates(az: Azurite, tmp_path: Path) -> None:
    root = tmp_path / "data" / "old"
    tree(root)
    st = stager(az)
    st.push(str(root), "chem")
    ages = [time.time() - at for _, _, at in st.store.keys(f"{PREFIX}acct-chem/")]
    assert ages and all(0 <= a < 600 for a in ages)  # dated, not "unknown" (never collected)
    report = st.gc(keep_days=1, live={}, grace=0, dry_run=True)
    assert report.namespace("acct-chem")["objects"] == 0, report.as_dict()  # all a day young
