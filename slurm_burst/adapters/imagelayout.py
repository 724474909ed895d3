"""The daemon's copy of a pinned image: from the site's OCI image layout (which may hold
other images and versions), exactly the pinned manifest's blobs, each verified against
its digest while it is copied, with an ``index.json`` listing that one image. It is
what the staging store gets and what a node loads (``core/images.py``).

The copy is made under a temporary name in ``work_dir`` and renamed into place whole
(``work_dir/<digest hex>``): one that exists is the verified image and is used again.
Files are opened without following links, and only regular files are read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from slurm_burst.core.images import (
    OCI_LAYOUT,
    Blob,
    ImageError,
    image_blobs,
    manifest_in_index,
    single_index,
)
from slurm_burst.fileio import FileRefused, ensure_dir, file_error, read_regular

CHUNK = 1 << 20
OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK


def pinned_copy(layout: str, ref: str, digest: str, work_dir: str) -> Path:
    """``work_dir/<hex>``: the image ``digest`` of ``layout``, alone and verified;
    :class:`ImageError` naming what is wrong."""
    hexd = digest.split(":", 1)[1]
    dest = Path(work_dir) / hexd
    if dest.is_dir() and not dest.is_symlink():
        return dest
    try:
        ensure_dir(work_dir, 0o700, None, "image copies directory")
        index = read_regular(Path(layout) / "index.json", 4 << 20)
    except (OSError, FileRefused) as exc:
        raise ImageError(f"image layout {layout}: {file_error(exc)}") from None
    manifest = manifest_in_index(index, digest, f"image layout {layout}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{hexd[:12]}.", dir=work_dir))
    try:
        blobs_dir = tmp / "blobs" / "sha256"
        blobs_dir.mkdir(parents=True)
        _copy(layout, manifest, blobs_dir)
        body = (blobs_dir / manifest.hex).read_bytes()
        for blob in image_blobs(body, digest, f"image layout {layout}"):
            _copy(layout, blob, blobs_dir)
        (tmp / "index.json").write_bytes(single_index(manifest, ref))
        (tmp / "oci-layout").write_bytes(OCI_LAYOUT)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _copy(layout: str, blob: Blob, blobs_dir: Path) -> None:
    """``blob`` from the site's layout into ``blobs_dir``, its size and SHA-256 checked."""
    src = Path(layout) / blob.path
    try:
        fd = os.open(src, OPEN)
    except OSError as exc:
        raise ImageError(f"image layout {layout}: the {blob.what} {blob.digest}: "
                         f"{file_error(exc)}") from None  # fmt: skip
    sha, size = hashlib.sha256(), 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ImageError(f"{src}: not a regular file")
        with open(blobs_dir / blob.hex, "wb") as out:
            while chunk := os.read(fd, CHUNK):
                sha.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    finally:
        os.close(fd)
    if sha.hexdigest() != blob.hex or size != blob.size:
        raise ImageError(
            f"image layout {layout}: the {blob.what} {blob.digest} holds {size} bytes whose "
            f"digest is sha256:{sha.hexdigest()} ({blob.size} expected): it is not the "
            "pinned image's"
        )
