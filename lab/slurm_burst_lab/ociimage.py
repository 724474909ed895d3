"""The lab's container image, and the site's side of it: what a site does with its
registry, done here without one (none is reachable).

- :func:`build`: an OCI image layout of a small image (Debian's static busybox, an
  os-release of its own and ``/fingerprint``, which prints the SHA-256 of what the
  container runs), written as the image-spec says, layer and config made reproducibly
  (sorted, mtime 0, root's): the same busybox gives the same digest;
- :func:`pin`: the site's configuration pinning it (a drop-in of the lab's config: the
  digest is this machine's, since it depends on the host's busybox) and naming it for
  group ``direct``, whose nodes then get it through the staging store before they join;
- :func:`load_onprem`: the on-prem node loads it from the shared directory (as a site's
  nodes pull from its registry), with the product's own loader (``node/images.py``).

Only on the host's release: the other releases' images have no podman.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from slurm_burst_lab.config import remove_dropin, write_dropin
from slurm_burst_lab.runtimeref import run_node_program

REF = "localhost/lab/fingerprint"
KEY = "fingerprint"
GROUP = "direct"
DROPIN = "60-lab-image.toml"
BUSYBOX = "/bin/busybox"  # Debian's busybox-static (make setup)
APPLETS = ("sh", "cat", "echo", "sha256sum", "uname")
FINGERPRINT = b"""#!/bin/sh
# what this container runs, as one line: the same on every node that runs this digest
echo "fingerprint $(cat /etc/os-release /fingerprint /bin/busybox | sha256sum)"
"""
EPOCH = "1970-01-01T00:00:00Z"


def _add(tf: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o755,
         link: str = "", directory: bool = False) -> None:  # fmt: skip
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
    if directory:
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        tf.addfile(ti)
    elif link:
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, link, 0o777
        tf.addfile(ti)
    else:
        ti.size, ti.mode = len(data), mode
        tf.addfile(ti, io.BytesIO(data))


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def build(layout: Path) -> str:
    """The image's OCI layout at ``layout`` (made again whole); its manifest digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev"):
            _add(tf, d, directory=True)
        _add(tf, "bin/busybox", Path(BUSYBOX).read_bytes())
        for applet in APPLETS:
            _add(tf, f"bin/{applet}", link="busybox")
        _add(tf, "etc/os-release", b'ID=slurm-burst-lab\nVERSION_ID="1"\n', 0o644)
        _add(tf, "fingerprint", FINGERPRINT)
    layer = buf.getvalue()
    layer_digest = f"sha256:{hashlib.sha256(layer).hexdigest()}"
    config = _json({
        "architecture": "amd64", "os": "linux", "created": EPOCH,
        "config": {"Cmd": ["/fingerprint"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": EPOCH, "created_by": "slurm-burst lab (ociimage.py)"}],
    })  # fmt: skip
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    manifest = _json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": len(layer)}],
    })  # fmt: skip
    digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for body in (layer, config, manifest):
        (blobs / hashlib.sha256(body).hexdigest()).write_bytes(body)
    (layout / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "1"},
    }]}  # fmt: skip
    (layout / "index.json").write_bytes(_json(index))
    return digest


def pin(config: Path, layout: Path, digest: str) -> Path:
    """The drop-in of the lab's config that pins the image and gives it to group
    ``direct`` (removed by :func:`unpin`)."""
    body = (
        "# written by 'lab up' (lab/slurm_burst_lab/ociimage.py), removed by 'lab down':\n"
        "# the lab's container image, pinned as a site pins its images by digest (this\n"
        "# machine's: it depends on the host's busybox)\n"
        f'[images.{KEY}]\nref = "{REF}"\ndigest = "{digest}"\nlayout = "{layout}"\n\n'
        f'[node_groups.{GROUP}]\nimages = ["{KEY}"]\n'
    )
    return write_dropin(config, DROPIN, body)


def unpin(config: Path) -> bool:
    """The drop-in removed (True), if there was one."""
    return remove_dropin(config, DROPIN)


def load_onprem(onprem: dict[str, dict[str, Any]], layout: Path, digest: str) -> None:
    """Each on-prem node loads the image from ``layout`` (the shared directory)."""
    for name in sorted(onprem):
        done = run_node_program(onprem[name], "images.py", "load", "--dir", str(layout),
                                "--ref", REF, "--digest", digest, timeout=120)  # fmt: skip
        said = done.stdout.decode(errors="replace").strip().splitlines()
        answer = json.loads(said[-1]) if said and said[-1].startswith("{") else {}
        if done.returncode != 0 or answer.get("ok") is not True:
            why = answer.get("problems") or done.stderr.decode(errors="replace")[-300:]
            raise RuntimeError(f"{name}: loading the lab's image failed: {why}")
