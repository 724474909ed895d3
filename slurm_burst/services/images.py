"""Container images on burst nodes, by digest: a node group's ``images`` reach each of
its nodes before slurmd starts, so that no job pulls over the WAN at its start and a
job runs the same content on-prem and in the cloud.

For each image the group names ([images.KEY]: ref, digest, layout):

1. the daemon's copy of exactly the pinned image (``adapters/imagelayout.py``: its
   blobs from the site's OCI layout, each verified against its digest), pushed once to
   the staging store's image namespace: content-addressed, so a layer two images share
   is stored once, and an image already there costs two requests;
2. pulled onto the node by the stage-in puller (every file verified, a read-only
   directory of root's under ``staging.node_dir``/images), counted in the ledger as a
   transfer (account ``site-images``);
3. loaded by ``node/images.py`` into the node's podman as ``REF:<hex16>`` (and so
   ``REF@DIGEST``), after checking that the layout holds the pinned image and nothing
   else, and that podman's digest of what it loaded is the pinned one.

Anything that differs is ``ImageDigest``: the node never joins, no job runs there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from slurm_burst.config import ImageConfig, NodeGroup
from slurm_burst.core.errors import BurstError, StepError
from slurm_burst.core.images import ImageError
from slurm_burst.core.jsonread import BadJson, read_json
from slurm_burst.core.numbers import json_count
from slurm_burst.core.records import NodeRecord
from slurm_burst.core.remote import RemoteError
from slurm_burst.core.staging import Manifest
from slurm_burst.ports import Clock, RemoteShell
from slurm_burst.services.nodestage import NodeStaging
from slurm_burst.services.staging import IMAGES_NS, Stager
from slurm_burst.services.transfers import TransferBook

log = logging.getLogger(__name__)

IMAGE_LOADER = "/etc/slurm-burst/images.py"


@dataclass(frozen=True, kw_only=True)
class ImageSettings:
    images: Mapping[str, ImageConfig]
    work_dir: str  # the daemon's verified copies (<state_dir>/images)
    node_dir: str  # staging.node_dir: the node's copies go under its images/


@dataclass(frozen=True, kw_only=True)
class ImagePorts:
    stager: Stager
    staging: NodeStaging  # runs the node's puller
    clock: Clock
    copy: Callable[[str, str, str, str], Path]  # (layout, ref, digest, work_dir) -> copy
    book: TransferBook | None = None


class Images:
    def __init__(self, settings: ImageSettings, ports: ImagePorts) -> None:
        self.settings = settings
        self.ports = ports
        self.loader = resources.files("slurm_burst.node").joinpath("images.py").read_bytes()
        self._lock = threading.Lock()
        self._shipped: dict[str, Manifest] = {}  # digest -> the store's manifest of it
        self._locks: dict[str, threading.Lock] = {}

    def shipped(self, key: str) -> Manifest:
        """The store's manifest of image ``key``, pushed there and read back first if
        this daemon has not yet (one push at a time per image; the others wait for it)."""
        im = self.settings.images[key]
        with self._lock:
            lock = self._locks.setdefault(im.digest, threading.Lock())
        with lock:
            known = self._shipped.get(im.digest)
            if known is not None:  # a manifest is immutable under its id: read once
                return known
            copy = self.ports.copy(im.layout, im.ref, im.digest, self.settings.work_dir)
            pushed = self.ports.stager.push_image(str(copy))
            log.info(
                "image.pushed key=%s digest=%s bytes=%d sent=%d unchanged=%s",
                key, im.digest, pushed.bytes, pushed.bytes_sent, pushed.unchanged,
            )  # fmt: skip
            self._shipped[im.digest] = self.ports.stager.image_manifest(pushed.manifest)
            return self._shipped[im.digest]

    def load(
        self, sh: RemoteShell, rec: NodeRecord, group: NodeGroup, deadline: float,
        step: Callable[..., str],
    ) -> None:  # fmt: skip
        """Every image of ``group`` onto ``rec``'s node, verified and loaded; StepError
        ``ImageDigest`` (or ``ImagePull``: the transfer) otherwise."""
        step(sh, "gpu-prepare")  # /etc/slurm-burst
        sh.put(self.loader, IMAGE_LOADER, 0o644)
        self.ports.staging.put_puller(sh)
        for key in group.images:
            im = self.settings.images[key]
            try:
                manifest = self.shipped(key)
            except ImageError as exc:
                raise StepError("ImageDigest", str(exc)) from None
            except BurstError as exc:
                raise StepError("ImagePull", f"image {key}: {exc}") from exc
            hexd = im.digest.split(":", 1)[1]
            dest = f"{self.settings.node_dir}/images/{hexd}"
            plan = self.ports.stager.image_plan(manifest, dest)
            try:
                out = self.ports.staging.run_plan(sh, plan, f"image-{hexd[:16]}", deadline)
            except RemoteError as exc:
                raise StepError("ImagePull", f"image {key} -> {rec.name}: {exc}") from exc
            if self.ports.book is not None:
                self.ports.book.pulled(
                    out, account=IMAGES_NS, user="root", job_id=0, dst=f"image:{key}",
                    node=rec.name, provider=rec.provider, manifest=manifest.id,
                )  # fmt: skip
            said = step(sh, "image-load", dest, im.ref, im.digest).strip().splitlines()
            try:
                answer = read_json(said[-1] if said else "", f"{rec.name}'s image load")
                ok = isinstance(answer, dict) and answer.get("ok") is True
                problems = "; ".join(str(p) for p in answer.get("problems", []))[:800]
            except (BadJson, AttributeError, TypeError):
                raise StepError(
                    "ImageDigest", f"image {key}: the node said {said[-1:]!r}"
                ) from None
            if not ok:
                raise StepError("ImageDigest", f"image {key} ({im.digest}): {problems}")
            log.info(
                "image.loaded node=%s key=%s digest=%s fetched_bytes=%d",
                rec.name, key, im.digest, json_count(out.get("fetched_bytes")),
            )  # fmt: skip
