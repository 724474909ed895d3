"""Container images by digest, without the lab: the daemon's copy of exactly the pinned
image out of a site's layout, pushed to a real S3-compatible server, pulled by the
node's puller, checked and loaded into a real podman (its own storage under the test's
directory), run by digest, with the fingerprint the site's own copy prints; and every
way a layout can be something else refused before anything loads or runs."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab import ociimage

from slurm_burst.adapters.imagelayout import pinned_copy
from slurm_burst.core.images import ImageError
from slurm_burst.node import images as node_images
from tests.integration.test_staging import pull, stager
from tests.s3server import S3Server

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or shutil.which("runc") is None,
    reason="podman and runc come with make setup (scripts/setup-system.sh)",
)
LOADER = Path(node_images.__file__)
REF = ociimage.REF


@pytest.fixture
def podman_env() -> Iterator[dict[str, str]]:
    """podman with storage and state of its own (the host's untouched), under a short
    path: conmon's sockets live there, and a socket's path has at most 107 bytes."""
    tmp_path = Path(tempfile.mkdtemp(prefix="sbpm-", dir="/tmp"))
    (tmp_path / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\nrunroot = "{tmp_path}/run"\ngraphroot = "{tmp_path}/graph"\n'
    )
    (tmp_path / "containers.conf").write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
        f'[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "none"\n'
        f'tmp_dir = "{tmp_path}/libpod"\n'
    )
    yield {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "CONTAINERS_STORAGE_CONF": str(tmp_path / "storage.conf"),
        "CONTAINERS_CONF": str(tmp_path / "containers.conf"),
    }
    subprocess.run(["chmod", "-R", "u+w", str(tmp_path)], check=False)
    shutil.rmtree(tmp_path, ignore_errors=True)


def site_layout(tmp_path: Path) -> tuple[Path, str]:
    """The site's layout: the lab's image, and another image's manifest and blob beside
    it (a layout holds what the site copied into it)."""
    layout = tmp_path / "site"
    digest = ociimage.build(layout)
    other = b'{"schemaVersion": 2, "config": {}, "layers": []}'
    other_hex = hashlib.sha256(other).hexdigest()
    (layout / "blobs" / "sha256" / other_hex).write_bytes(other)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "digest": f"sha256:{other_hex}", "size": len(other)})  # fmt: skip
    (layout / "index.json").write_text(json.dumps(index))
    return layout, digest


def load(layout: Path, digest: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(LOADER), "load", "--dir", str(layout), "--ref", REF,
         "--digest", digest],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def run(env: dict[str, str], image: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "run", "--rm", "--pull=never", "--network=none", image],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_pinned_image_goes_through_the_store_and_runs_by_digest_as_on_prem(
    server: S3Server, tmp_path: Path, podman_env: dict[str, str]
) -> None:
    layout, digest = site_layout(tmp_path)
    copy = pinned_copy(str(layout), REF, digest, str(tmp_path / "work"))
    blobs = sorted(p.name for p in (copy / "blobs" / "sha256").iterdir())
    assert len(blobs) == 3 and digest.split(":")[1] in blobs  # manifest, config, layer
    assert [m["digest"] for m in json.loads((copy / "index.json").read_text())["manifests"]] == [
        digest
    ]
    st = stager(server)
    pushed = st.push_image(str(copy))
    assert pushed.objects_sent == 5 and st.push_image(str(copy)).unchanged  # + index, layout
    dest = tmp_path / "node" / "images" / digest.split(":")[1]
    rc, out = pull(st.image_plan(st.image_manifest(pushed.manifest), str(dest)))
    assert rc == 0 and out["files"] == 5, out
    assert load(dest, digest, podman_env)["ok"] is True
    on_burst = run(podman_env, f"{REF}@{digest}")
    assert on_burst.returncode == 0, on_burst.stderr
    # on-prem: the site's own copy loaded into another podman
    mine = Path(podman_env["CONTAINERS_CONF"]).parent
    other = mine / "onprem"
    other.mkdir()
    on_prem_env = dict(podman_env)
    for name, var in (("storage.conf", "CONTAINERS_STORAGE_CONF"),
                      ("containers.conf", "CONTAINERS_CONF")):  # fmt: skip
        (other / name).write_text((mine / name).read_text().replace(str(mine), str(other)))
        on_prem_env[var] = str(other / name)
    site_copy = pinned_copy(str(layout), REF, digest, str(other / "work"))
    assert load(site_copy, digest, on_prem_env)["ok"] is True
    on_prem = run(on_prem_env, f"{REF}@{digest}")
    assert on_prem.stdout.startswith("fingerprint ") and on_prem.stdout == on_burst.stdout
    wrong = run(podman_env, f"{REF}@sha256:{'0' * 64}")
    assert wrong.returncode != 0 and "fingerprint" not in wrong.stdout  # never run


def test_a_layout_that_is_not_the_pinned_image_is_refused(tmp_path: Path) -> None:
    layout, digest = site_layout(tmp_path)
    with pytest.raises(ImageError, match=r"does not list sha256:0+: the layout holds another"):
        pinned_copy(str(layout), REF, "sha256:" + "0" * 64, str(tmp_path / "w0"))
    manifest = json.loads((layout / "blobs" / "sha256" / digest.split(":")[1]).read_bytes())
    layer = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]
    layer.write_bytes(layer.read_bytes()[:-1] + b"X")  # one byte of the layer
    with pytest.raises(ImageError, match=r"the layer 1 sha256:.* it is not the pinned image's"):
        pinned_copy(str(layout), REF, digest, str(tmp_path / "w1"))
    assert not any((tmp_path / "w1").iterdir())  # nothing half made left
    layer.unlink()
    layer.symlink_to("/etc/hostname")
    with pytest.raises(ImageError, match=r"the layer 1 .*Too many levels of symbolic links"):
        pinned_copy(str(layout), REF, digest, str(tmp_path / "w2"))


def test_the_node_refuses_a_layout_that_holds_anything_else(tmp_path: Path) -> None:
    layout, digest = site_layout(tmp_path / "s")
    copy = pinned_copy(str(layout), REF, digest, str(tmp_path / "work"))
    assert node_images.verify(str(copy), digest) == []
    assert node_images.verify(str(layout), digest)[0].endswith(f"not {digest} alone")
    assert node_images.verify(str(copy), "sha256:" + "1" * 64)[0].startswith("index.json lists")
    blob = next(p for p in (copy / "blobs" / "sha256").iterdir() if p.name != digest[7:])
    blob.chmod(0o644)
    blob.write_bytes(b"not what its name says")
    assert [p for p in node_images.verify(str(copy), digest) if "its content is" in p]
    assert node_images.main(["load", "--dir", str(copy), "--ref", "Bad Ref!", "--digest",
                             digest]) == 2  # fmt: skip
