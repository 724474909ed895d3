"""Runtime manifests on disk: a node group's reference (``runtime_manifest``, read at
each join so that a new capture needs no restart; a file that did not change is not
parsed again) and the manifests the daemon keeps of the nodes it checked
(``<state_dir>/runtime/<node>.json``, for ``slurm-burst runtime diff node:NAME``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from slurm_burst.core.jsonread import BadJson, read_json
from slurm_burst.core.runtime import Manifest, ManifestError, from_document
from slurm_burst.core.slurmsyntax import is_node_name
from slurm_burst.fileio import FileRefused, ensure_dir, file_error, write_durable
from slurm_burst.trusted import Writers, read_checked

MAX_BYTES = 4 * 1024 * 1024  # a manifest of 4,096 libraries with digests is ~0.5 MB
NODES_DIR = "runtime"


def read_manifest(path: str | os.PathLike[str], *, trusted: bool = True) -> tuple[Manifest, bytes]:
    """The manifest at ``path`` and its bytes; :class:`ManifestError` saying why not.
    ``trusted``: a reference decides which nodes join, so it must be root's or ours
    (not writable by others), as the config is."""
    where = f"runtime manifest {path}"
    try:
        data, why = read_checked(path, Writers.us(), MAX_BYTES, follow=True)
    except FileRefused as exc:
        raise ManifestError(f"{where}: {exc}") from None
    except OSError as exc:
        raise ManifestError(f"runtime manifest {file_error(exc)}") from None
    except ValueError:  # a NUL in the path
        raise ManifestError(f"{where!r}: not a path") from None
    if trusted and why:
        raise ManifestError(f"{where}: {why}; slurm-burst does not act on it")
    try:
        doc = read_json(data, where)
    except BadJson as exc:  # not JSON, too deep, NaN...: this manifest's fault, said so
        raise ManifestError(str(exc)) from None
    return from_document(doc, where), data


class References:
    """The groups' reference manifests, read again when their file changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int, int], Manifest, bytes]] = {}

    def __call__(self, path: str) -> tuple[Manifest, bytes]:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ManifestError(f"runtime manifest {file_error(exc)}") from None
        except ValueError:  # a NUL in the path
            raise ManifestError(f"runtime manifest {path!r}: not a path") from None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
            if hit is not None and hit[0] == key:
                return hit[1], hit[2]
        manifest, data = read_manifest(path)
        with self._lock:
            self._cache[path] = (key, manifest, data)
        return manifest, data


def node_manifest_path(state_dir: str | os.PathLike[str], node: str) -> Path:
    if not is_node_name(node):
        raise ManifestError(f"{node[:80]!r} is not a node name")
    return Path(state_dir) / NODES_DIR / f"{node}.json"


def keep_node_manifest(state_dir: str | os.PathLike[str], node: str, data: bytes) -> None:
    """What ``node`` said of its runtime at its last check, kept (0640, written
    without following links) for ``runtime diff``."""
    path = node_manifest_path(state_dir, node)
    ensure_dir(path.parent, 0o750, None, "runtime manifests directory")
    write_durable(path.parent, path.name, data, 0o640)
