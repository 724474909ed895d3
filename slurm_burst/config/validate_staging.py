"""Semantic checks of ``[stores.*]`` and ``[staging]``. Pure: no file or network access."""

from __future__ import annotations

import ipaddress
import math
import re

from slurm_burst.config.model import Config, StoreConfig
from slurm_burst.config.schema import Problem
from slurm_burst.core.images import is_digest, is_image_name
from slurm_burst.core.staging import StagingError, check_src

PRICES = ("upload_per_gb", "download_per_gb", "egress_per_gb", "storage_per_gb_month")
DRIVERS = ("s3", "google_storage", "azure_blobs", "mesh")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", re.ASCII)  # S3's bucket names
_CONTAINER = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", re.ASCII)  # Azure's
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", re.ASCII)
_PREFIX = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,62}/){0,8}", re.ASCII)
_REGION = re.compile(r"[a-z0-9-]{1,32}", re.ASCII)
_MARKER = re.compile(r"\.?[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)


def image_problems(cfg: Config) -> list[Problem]:
    """``[images.*]`` and the groups' ``images``: images travel through the store."""
    out: list[Problem] = []
    for key, im in cfg.images.items():
        base = f"images.{key}"
        if not is_image_name(im.ref):
            out.append(Problem(f"{base}.ref", "must be an image name without tag or digest "
                               "(lower-case, e.g. registry.example.org/ml/pytorch)"))  # fmt: skip
        if not is_digest(im.digest):
            out.append(Problem(f"{base}.digest", "must be sha256:<64 lower-case hex digits>"))
        if not im.layout.startswith("/") or "\0" in im.layout:
            out.append(Problem(f"{base}.layout", "must be an absolute path"))
    for name, g in cfg.node_groups.items():
        for key in g.images:
            if key not in cfg.images:
                out.append(Problem(f"node_groups.{name}.images", f"no image {key!r} in [images]"))
        if g.images and not cfg.staging.store:
            why = "images reach nodes through the staging store: set staging.store"
            out.append(Problem(f"node_groups.{name}.images", why))
    return out


def staging_problems(cfg: Config) -> list[Problem]:
    out: list[Problem] = image_problems(cfg)
    served: dict[str, str] = {}  # provider -> store
    for name, st in cfg.stores.items():
        base = f"stores.{name}"
        if st.driver not in DRIVERS:
            out.append(Problem(f"{base}.driver", f"must be one of {', '.join(DRIVERS)}"))
        if st.driver == "mesh":
            out.extend(_mesh_problems(cfg, base, st))
        elif st.driver == "azure_blobs":
            if not _CONTAINER.fullmatch(st.bucket) or "--" in st.bucket:
                out.append(Problem(f"{base}.bucket", "must be an Azure container name "
                                   "(3-63 of a-z0-9-, no --)"))  # fmt: skip
        elif not _BUCKET.fullmatch(st.bucket) or ".." in st.bucket:
            out.append(Problem(f"{base}.bucket", "must be an S3 bucket name (3-63 of a-z0-9.-)"))
        if not _REGION.fullmatch(st.region):
            out.append(Problem(f"{base}.region", "must be a region name (e.g. us-east-1)"))
        if st.endpoint and st.driver != "mesh" and not _endpoint(st.endpoint):
            out.append(Problem(f"{base}.endpoint", "must be HOST or HOST:PORT"))
        if not _PREFIX.fullmatch(st.prefix):
            out.append(Problem(f"{base}.prefix", "must be '' or names ending in '/' (a/b/)"))
        creds = st.credentials
        if creds is not None and creds.file and (creds.key_env or creds.secret_env):
            out.append(Problem(f"{base}.credentials", "give either 'file' or key_env/secret_env"))
        for key in PRICES:
            price = getattr(st, key)
            if not (isinstance(price, int | float) and math.isfinite(price) and 0 <= price < 1e4):
                out.append(Problem(f"{base}.{key}", "must be dollars per GB, 0 to 10,000"))
        for prov in st.providers:
            if prov not in cfg.providers:
                out.append(Problem(f"{base}.providers", f"no provider profile {prov!r}"))
            elif prov in served:
                out.append(Problem(f"{base}.providers", f"{prov} is served by {served[prov]}"))
            served.setdefault(prov, name)
    s = cfg.staging
    if s.store and s.store not in cfg.stores:
        out.append(Problem("staging.store", f"no store {s.store!r} in [stores]"))
    if not 1 <= s.transfers <= 64:
        out.append(Problem("staging.transfers", "must be between 1 and 64"))
    if not (math.isfinite(s.bandwidth_mbit) and 0 <= s.bandwidth_mbit <= 1e6):
        out.append(Problem("staging.bandwidth_mbit", "must be 0 (no limit) to 1,000,000"))
    if not (math.isfinite(s.link_mbit) and 0 <= s.link_mbit <= 1e6):
        out.append(Problem("staging.link_mbit", "must be 0 (not counted) to 1,000,000"))
    if not (math.isfinite(s.keep_days) and 1 <= s.keep_days <= 36500):
        out.append(Problem("staging.keep_days", "must be between 1 and 36,500 days"))
    if not (math.isfinite(s.release_deadline) and 60 <= s.release_deadline <= 86400):
        out.append(Problem("staging.release_deadline", "must be between 60 and 86,400 seconds"))
    if not 60 <= s.grant_seconds <= 7 * 86400:
        out.append(Problem("staging.grant_seconds", "must be between 60 s and 7 days"))
    for i, path in enumerate(s.onprem_only_paths):
        try:
            check_src(path, "path")
        except StagingError as exc:
            out.append(Problem(f"staging.onprem_only_paths[{i}]", str(exc)))
    if not _MARKER.fullmatch(s.marker):
        out.append(Problem("staging.marker", "must be a file name (letters, digits, ._-)"))
    try:
        check_src(s.node_dir, "node_dir")
    except StagingError as exc:
        out.append(Problem("staging.node_dir", str(exc)))
    return out


def _mesh_problems(cfg: Config, base: str, st: StoreConfig) -> list[Problem]:
    """A mesh store: a directory of its own, served on an address of the mesh."""
    out = []
    try:
        check_src(st.directory, "directory")
    except StagingError as exc:
        out.append(Problem(f"{base}.directory", str(exc)))
    if st.credentials is not None:
        out.append(Problem(f"{base}.credentials", "a mesh store has none (its grant key is "
                           "made by the daemon)"))  # fmt: skip
    if st.endpoint:
        host, _, port = st.endpoint.rpartition(":")
        try:
            inside = ipaddress.ip_address(host) in ipaddress.ip_network(cfg.mesh.subnet)
        except ValueError:
            inside = False
        if not (inside and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            why = f"ADDRESS in the mesh ({cfg.mesh.subnet}): the nodes reach the store there"
            out.append(Problem(f"{base}.endpoint", f"must be ADDRESS:PORT, {why}"))
    return out


def _endpoint(text: str) -> bool:
    host, sep, port = text.rpartition(":") if ":" in text else (text, "", "")
    if sep and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return False
    return bool(_HOST.fullmatch(host))
