"""Stage-in, the site's half: a dataset pushed to object storage, and what a node needs
to pull it.

``push`` (``slurm-burst stage push``, and the daemon for a job bound to cloud nodes):

1. resolve the source (every symlink and '..') and refuse it if the site keeps it home
   (:func:`core.staging.kept_home`; a marked directory, by the tree);
2. list and hash its files (in ``transfers`` threads; hashlib lets go of the GIL);
3. build the manifest; if the dataset's pointer already names it, stop: an unchanged
   tree costs one request and sends nothing;
4. objects the previous version stored are there; every other object is asked for
   (one HEAD each: another dataset of the account may hold it) and the missing ones are
   sent, largest first, ``transfers`` at a time, within the bandwidth limit;
5. write the manifest, then the pointer. A push killed on the way resumes without
   sending again what is stored: its objects are found by their names.

``node_plan`` is what the node's fetcher (``node/stagein.py``) is handed over SSH: the
manifest's files, each with a read-only URL for its object, valid ``grant_seconds``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from slurm_burst.core.ratelimit import TokenBucket
from slurm_burst.core.staging import (
    MAX_MANIFEST_BYTES,
    Entry,
    KeptHome,
    Layout,
    Manifest,
    Pointer,
    SensitiveData,
    StorageError,
    kept_home,
    namespace,
    parse_manifest,
    parse_pointer,
    pointer_body,
    to_send,
    worth_compressing,
)
from slurm_burst.ports import Clock, DatasetTree, ObjectStore

T = TypeVar("T")
R = TypeVar("R")
Progress = Callable[[str, int, int], None]  # (step, done, total)


@dataclass(frozen=True, kw_only=True)
class StagingSettings:
    prefix: str = ""  # of every key in the bucket ("" or ending in '/')
    transfers: int = 4  # files hashed or sent at once
    bandwidth: float = 0.0  # bytes per second for all uploads together; 0: no limit
    compress: bool = True  # zlib where a sample shrinks by a tenth
    grant_seconds: int = 900  # how long a node's read-only URLs last


@dataclass(frozen=True)
class Pushed:
    """What a push did: the dataset version, and what it cost."""

    src: str
    real_src: str
    account: str
    manifest: str
    files: int
    bytes: int  # the dataset's size
    objects: int  # distinct objects
    objects_sent: int
    bytes_sent: int  # on the wire (compressed where stored so)
    requests: int
    seconds: float
    unchanged: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Stager:
    def __init__(
        self,
        *,
        settings: StagingSettings,
        store: ObjectStore,
        tree: DatasetTree,
        clock: Clock,
        kept: KeptHome | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.tree = tree
        self.clock = clock
        self.kept = kept or KeptHome()
        self.progress = progress or (lambda step, done, total: None)
        self._bucket = TokenBucket(settings.bandwidth, max(65536.0, settings.bandwidth / 4))
        self._lock = threading.Lock()
        self._requests = 0

    # -- push --------------------------------------------------------------------------

    def push(self, src: str, account: str, qos: str = "") -> Pushed:
        started = self.clock.monotonic()
        layout = Layout(self.settings.prefix, namespace(account))
        real = self.tree.resolve(src)
        reason = kept_home(real, account, qos, self.kept)
        if reason:
            raise SensitiveData(f"stage of {src} refused: {reason}")
        manifest = self._manifest(src, real)
        self._requests = 0
        old = self._pointer(layout, src)
        if old is not None and old.manifest == manifest.id:
            return self._pushed(src, real, account, manifest, [], 0, started, unchanged=True)
        known = self._stored_by(layout, old)
        candidates = to_send(manifest, known)
        present = self._map(lambda e: self._has(layout.object(e.object_name())), candidates)
        missing = [e for e, there in zip(candidates, present, strict=True) if not there]
        total = sum(e.size for e in missing)
        sent_so_far = [0]

        def send(e: Entry) -> int:
            n = self._send(layout, real, e)
            with self._lock:
                sent_so_far[0] += e.size
                self.progress("send", sent_so_far[0], total)
            return n

        self.progress("send", 0, total)
        sent = self._map(send, missing)
        if not self._has(layout.manifest(manifest.id)):
            sent.append(self._write(layout.manifest(manifest.id), manifest.body))
        sent.append(self._write(layout.pointer(src), pointer_body(src, manifest, self.clock.now())))
        return self._pushed(src, real, account, manifest, missing, sum(sent), started)

    def _manifest(self, src: str, real: str) -> Manifest:
        listing = self.tree.files(real)
        total = sum(size for _, size, _ in listing)
        done = [0]
        self.progress("hash", 0, total)

        def digest(item: tuple[str, int, bool]) -> Entry:
            path, size, exe = item
            sha, squeezed, sample = self.tree.digest(real, path, size)
            zipped = self.settings.compress and worth_compressing(size, sample, squeezed)
            with self._lock:
                done[0] += size
                self.progress("hash", done[0], total)
            return Entry(path, size, sha, exe, "zlib" if zipped else "")

        return Manifest.build(src, self._map(digest, listing))

    def _stored_by(self, layout: Layout, old: Pointer | None) -> set[str]:
        """Objects the dataset's previous version stored (their manifest came after them)."""
        if old is None:
            return set()
        body = self._read(layout.manifest(old.manifest), MAX_MANIFEST_BYTES)
        if body is None:
            return set()
        return set(parse_manifest(body, layout.manifest(old.manifest)).objects())

    def _send(self, layout: Layout, real: str, e: Entry) -> int:
        key = layout.object(e.object_name())
        with self._lock:
            self._requests += 1
        try:
            with self.tree.body(real, e.path, e.sha256, e.encoding) as (body, size):
                return self.store.write(key, body, size, self._pace)
        except BaseException:
            # the file changed under us, or the send failed half-way: whatever was stored
            # under a name it does not match must not stay (readers verify anyway)
            with contextlib.suppress(StorageError):
                self.store.delete(key)
            raise

    def _pace(self, n: int) -> None:
        if self.settings.bandwidth <= 0:
            return
        with self._lock:
            wait = self._bucket.reserve(self.clock.monotonic(), n)
        if wait > 0:
            self.clock.sleep(wait)

    # -- reading back ------------------------------------------------------------------

    def status(self, account: str, src: str | None = None) -> list[Pointer]:
        """The account's datasets (or the one of ``src``), newest version of each."""
        layout = Layout(self.settings.prefix, namespace(account))
        if src is not None:
            p = self._pointer(layout, src)
            return [p] if p else []
        keys = [k for k, _ in self.store.keys(layout.pointers()) if k.endswith(".json")]
        found = self._map(lambda k: self._read(k, 65536), keys)
        out = [parse_pointer(body, key) for key, body in zip(keys, found, strict=True) if body]
        return sorted(out, key=lambda p: p.src)

    def manifest(self, account: str, src: str) -> Manifest | None:
        layout = Layout(self.settings.prefix, namespace(account))
        p = self._pointer(layout, src)
        if p is None:
            return None
        body = self._read(layout.manifest(p.manifest), MAX_MANIFEST_BYTES)
        return parse_manifest(body, layout.manifest(p.manifest)) if body else None

    def node_plan(
        self, account: str, manifest: Manifest, dest: str, uid: int, gid: int
    ) -> dict[str, Any]:
        """What ``node/stagein.py`` is handed: where the dataset goes, whose it is, and
        each file with a read-only URL for its object (no request is made)."""
        layout = Layout(self.settings.prefix, namespace(account))
        seconds = self.settings.grant_seconds
        grants = {
            name: self.store.grant(layout.object(name), seconds) for name in manifest.objects()
        }
        return {
            "v": 1,
            "dest": dest,
            "manifest": manifest.id,
            "uid": uid,
            "gid": gid,
            "files": [
                {
                    "path": e.path,
                    "size": e.size,
                    "sha256": e.sha256,
                    "executable": e.executable,
                    "encoding": e.encoding,
                    "url": grants[e.object_name()],
                }
                for e in manifest.entries
            ],
        }

    # -- helpers -----------------------------------------------------------------------

    def _pointer(self, layout: Layout, src: str) -> Pointer | None:
        body = self._read(layout.pointer(src), 65536)
        return parse_pointer(body, layout.pointer(src)) if body else None

    def _read(self, key: str, limit: int) -> bytes | None:
        with self._lock:
            self._requests += 1
        return self.store.read(key, limit)

    def _has(self, key: str) -> bool:
        with self._lock:
            self._requests += 1
        return self.store.has(key)

    def _write(self, key: str, body: bytes) -> int:
        with self._lock:
            self._requests += 1
        return self.store.write_bytes(key, body)

    def _map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if len(items) <= 1 or self.settings.transfers <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(self.settings.transfers, thread_name_prefix="stage") as pool:
            return list(pool.map(fn, items))

    def _pushed(
        self, src: str, real: str, account: str, manifest: Manifest, sent: Iterable[Entry],
        bytes_sent: int, started: float, unchanged: bool = False,
    ) -> Pushed:  # fmt: skip
        sent = list(sent)
        return Pushed(
            src=src, real_src=real, account=account, manifest=manifest.id,
            files=len(manifest.entries), bytes=manifest.size, objects=len(manifest.objects()),
            objects_sent=len(sent), bytes_sent=bytes_sent, requests=self._requests,
            seconds=round(self.clock.monotonic() - started, 3), unchanged=unchanged,
        )  # fmt: skip
