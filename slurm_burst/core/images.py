"""Container images by digest: what an OCI image layout must hold for an image the
site pins, and nothing else.

An image is named by the digest of its manifest (``sha256:<64 hex>``), which names its
config and layers by their digests in turn: the content is fixed by the one digest the
configuration holds. :func:`image_blobs` reads an OCI image layout's ``index.json`` and
the pinned manifest (the caller hashes the files: no I/O here) and gives every blob the
image needs, so that the daemon ships exactly those, and the node, having verified each
against its name, loads an image that can only be the pinned one.

OCI image layout (image-spec ``image-layout.md``): ``oci-layout``, ``index.json`` (a
list of manifest descriptors), ``blobs/sha256/<hex>`` (content-addressed). Pure:
stdlib only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from slurm_burst.core.errors import BadInput

DIGEST = re.compile(r"sha256:([0-9a-f]{64})", re.ASCII)
# a reference as podman and Slurm's oci.conf take it, without tag or digest
NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*",
                  re.ASCII)  # fmt: skip
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
MAX_DOC = 4 * 1024 * 1024  # index.json or a manifest
MAX_LAYERS = 512


class ImageError(BadInput):
    """An image that is not the pinned one, or a layout that does not hold it."""

    code = "ImageDigest"


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256:<hex>
    size: int
    what: str  # "manifest", "config", "layer 3"

    @property
    def hex(self) -> str:
        return self.digest.split(":", 1)[1]

    @property
    def path(self) -> str:
        """Its path in a layout."""
        return f"blobs/sha256/{self.hex}"


def is_digest(text: str) -> bool:
    return DIGEST.fullmatch(text) is not None


def is_image_name(text: str) -> bool:
    return len(text) <= 255 and NAME.fullmatch(text) is not None


def manifest_in_index(index: bytes, digest: str, where: str) -> Blob:
    """The descriptor of the manifest ``digest`` in a layout's ``index.json``."""
    doc = _doc(index, f"{where}: index.json")
    manifests = doc.get("manifests")
    if not isinstance(manifests, list):
        raise ImageError(f"{where}: index.json lists no manifests")
    for m in manifests:
        if isinstance(m, dict) and m.get("digest") == digest:
            if m.get("mediaType") not in MANIFEST_TYPES:
                kind = m.get("mediaType")
                raise ImageError(
                    f"{where}: {digest} is a {kind!r}, not an image manifest "
                    "(an index of platforms: pin the platform's manifest)"
                )
            return Blob(digest, _size(m, where), "manifest")
    raise ImageError(f"{where}: index.json does not list {digest}: the layout holds another image")


def image_blobs(manifest: bytes, digest: str, where: str) -> list[Blob]:
    """The config and layers the manifest (whose bytes hash to ``digest``: checked by the
    caller) names, in its order."""
    doc = _doc(manifest, f"{where}: manifest {digest}")
    config = doc.get("config")
    layers = doc.get("layers")
    if not isinstance(config, dict) or not isinstance(layers, list):
        raise ImageError(f"{where}: manifest {digest} has no config or layers")
    if len(layers) > MAX_LAYERS:
        raise ImageError(f"{where}: manifest {digest} has {len(layers)} layers, over {MAX_LAYERS}")
    out = [_blob(config, "config", where)]
    out += [_blob(layer, f"layer {i + 1}", where) for i, layer in enumerate(layers)]
    return out


def single_index(manifest: Blob, name: str) -> bytes:
    """An ``index.json`` that lists ``manifest`` alone, tagged as ``name``'s digest hex:
    the layout a node loads holds one image, the pinned one."""
    return json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_TYPES[0],
                    "digest": manifest.digest,
                    "size": manifest.size,
                    "annotations": {
                        "org.opencontainers.image.ref.name": manifest.hex[:16],
                        "io.slurm-burst.image.name": name,
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()


OCI_LAYOUT = b'{"imageLayoutVersion": "1.0.0"}'


def _doc(data: bytes, where: str) -> dict[str, Any]:
    if len(data) > MAX_DOC:
        raise ImageError(f"{where}: {len(data):,} bytes, over {MAX_DOC:,}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ImageError(f"{where}: not JSON") from None
    if not isinstance(doc, dict):
        raise ImageError(f"{where}: not a JSON object")
    return doc


def _size(d: dict[str, Any], where: str) -> int:
    size = d.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 42:
        raise ImageError(f"{where}: a descriptor's size is {size!r}")
    return size


def _blob(d: Any, what: str, where: str) -> Blob:
    if not isinstance(d, dict) or not isinstance(d.get("digest"), str):
        raise ImageError(f"{where}: the {what} has no digest")
    digest = d["digest"]
    if not is_digest(digest):
        raise ImageError(f"{where}: the {what}'s digest {digest[:80]!r} is not sha256:<64 hex>")
    return Blob(digest, _size(d, where), what)
