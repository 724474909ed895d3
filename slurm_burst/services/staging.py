"""Stage-in, the site's half: a dataset pushed to object storage, and what a node needs
to pull it.

``push`` (``slurm-burst stage push``, and the daemon for a job bound to cloud nodes):

1. resolve the source (every symlink and '..') and refuse it if the site keeps it home
   (:func:`core.staging.kept_home`; a marked directory, by the tree);
2. list and hash its files (large files in ``transfers`` threads: hashlib lets go of
   the GIL for them);
3. read the dataset's pointer and previous manifest, and build the manifest (a file's
   encoding is its object's, if the previous version stored it); if the pointer names
   it, stop: an unchanged tree costs two requests and sends nothing;
4. objects the previous version stored are there; the others are looked for (another
   dataset of the account may hold them: a shard of several is listed, a lone one
   asked for) and the missing ones are sent, largest first, ``transfers`` at a time,
   within the bandwidth limit; a request that fails for a reason worth another is
   made again with backoff;
5. write the manifest, then the pointer. A push killed on the way resumes without
   sending again what is stored: its objects are found by their names.

``node_plan`` is what the node's fetcher (``node/stagein.py``) is handed over SSH: the
manifest's files, each with a read-only URL for its object, valid ``grant_seconds``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slurm_burst.core.cloud import backoff
from slurm_burst.core.pricing import stored_byte_seconds
from slurm_burst.core.ratelimit import TokenBucket
from slurm_burst.core.staging import (
    COMPRESS_MIN,
    MAX_MANIFEST_BYTES,
    CorruptOutput,
    Entry,
    KeptHome,
    Layout,
    Manifest,
    Pointer,
    SensitiveData,
    StagingError,
    StorageError,
    kept_home,
    namespace,
    parse_manifest,
    parse_pointer,
    pointer_body,
    stored_kind,
    to_send,
    worth_compressing,
)
from slurm_burst.ports import Clock, DatasetTree, ObjectStore, OutputHome

T = TypeVar("T")
R = TypeVar("R")
Progress = Callable[[str, int, int], None]  # (step, done, total)


@dataclass(frozen=True, kw_only=True)
class StagingSettings:
    prefix: str = ""  # of every key in the bucket ("" or ending in '/')
    transfers: int = 4  # files hashed or sent at once
    attempts: int = 5  # tries of a store call that failed for a reason worth another
    bandwidth: float = 0.0  # bytes per second for all uploads together; 0: no limit
    compress: bool = True  # zlib where a sample shrinks by a tenth
    grant_seconds: int = 900  # how long a node's read-only URLs last


_KINDS = {"d": "pointers", "m": "manifests", "o": "objects"}


@dataclass(frozen=True)
class Held:
    """What a namespace held when gc listed it, and for how long since ``since`` (None:
    each key since its write): what storage's booking charges."""

    keys: int
    bytes: int
    byte_seconds: int
    since: float | None


@dataclass
class GcReport:
    """What :meth:`Stager.gc` removed (or, with ``dry_run``, would), per namespace; with
    the namespaces' last bookings given, what each held since (``held``, at ``at``)."""

    dry_run: bool
    keys: int = 0  # keys listed under the store's prefix
    namespaces: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    at: float = 0.0
    held: dict[str, Held] = field(default_factory=dict)

    def namespace(self, ns: str) -> dict[str, int]:
        return self.namespaces.setdefault(ns, dict.fromkeys(
            ("pointers", "manifests", "objects", "bytes_freed", "objects_kept", "bytes_kept"), 0
        ))  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        total = {k: sum(n[k] for n in self.namespaces.values())
                 for k in ("pointers", "manifests", "objects", "bytes_freed", "objects_kept",
                           "bytes_kept")}  # fmt: skip
        return {"dry_run": self.dry_run, "keys": self.keys, "total": total,
                "namespaces": [{"namespace": ns, **row} for ns, row in
                               sorted(self.namespaces.items())],
                "problems": self.problems}  # fmt: skip


IMAGES_NS = "site-images"  # the store namespace of [images] (not an account's: never gc'd)


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
        rand: Callable[[], float] = random.random,
        home: OutputHome | None = None,
    ) -> None:
        self.settings = settings
        self.home = home  # where outputs land on-prem (promote)
        self.store = store
        self.tree = tree
        self.clock = clock
        self.kept = kept or KeptHome()
        self.progress = progress or (lambda step, done, total: None)
        self.rand = rand
        self._bucket = TokenBucket(settings.bandwidth, max(65536.0, settings.bandwidth / 4))
        self._lock = threading.Lock()
        self._requests = 0

    # -- push --------------------------------------------------------------------------

    def check(self, src: str, account: str, qos: str = "") -> dict[str, Any]:
        """What :meth:`push` checks before it reads a byte: the source resolved, the
        site's rules, and every directory of the tree for the marker (SensitiveData if
        the data may not leave). Nothing is read or sent."""
        namespace(account)
        real, listing = self._cleared(src, account, qos)
        return {"src": src, "real_src": real, "files": len(listing),
                "bytes": sum(size for _, size, _ in listing)}  # fmt: skip

    def _cleared(self, src: str, account: str, qos: str) -> tuple[str, list[tuple[str, int, bool]]]:
        real = self.tree.resolve(src)
        reason = kept_home(real, account, qos, self.kept.resolved(self.tree.real))
        if reason:
            raise SensitiveData(f"stage of {src} refused: {reason}")
        return real, self.tree.files(real)

    def push(self, src: str, account: str, qos: str = "") -> Pushed:
        started = self.clock.monotonic()
        layout = Layout(self.settings.prefix, namespace(account))
        real, listing = self._cleared(src, account, qos)
        return self._push(layout, src, real, listing, account, started)

    def push_image(self, src: str) -> Pushed:
        """An image's layout (the daemon's own copy of the pinned image's blobs) pushed
        to the site's image namespace, which no account owns and ``gc`` never sweeps."""
        started = self.clock.monotonic()
        real = self.tree.resolve(src)
        layout = Layout(self.settings.prefix, IMAGES_NS)
        return self._push(layout, src, real, self.tree.files(real), IMAGES_NS, started)

    def image_manifest(self, manifest_id: str) -> Manifest:
        return self._manifest_at(Layout(self.settings.prefix, IMAGES_NS), manifest_id)

    def image_plan(self, manifest: Manifest, dest: str) -> dict[str, Any]:
        """What ``node/stagein.py`` is handed for an image: root's, read-only."""
        return self._plan(Layout(self.settings.prefix, IMAGES_NS), manifest, dest, 0, 0, False)

    def _push(
        self, layout: Layout, src: str, real: str, listing: list[tuple[str, int, bool]],
        account: str, started: float,
    ) -> Pushed:  # fmt: skip
        digests = self._digests(real, listing)
        self._requests = 0
        old = self._pointer(layout, src)
        before = self._previous(layout, old)
        manifest = self._manifest(src, real, listing, digests, before)
        if old is not None and old.manifest == manifest.id:
            return self._pushed(src, real, account, manifest, 0, 0, started, unchanged=True)
        known = set(before.objects()) if before else set()
        candidates = to_send(manifest, known)
        missing = self._missing(layout, candidates)
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
        return self._pushed(src, real, account, manifest, len(missing), sum(sent), started)

    def _digests(self, real: str, listing: list[tuple[str, int, bool]]) -> list[str]:
        total = sum(size for _, size, _ in listing)
        done = [0]
        self.progress("hash", 0, total)

        def digest(item: tuple[str, int, bool]) -> str:
            sha = self.tree.digest(real, item[0], item[1])
            with self._lock:
                done[0] += item[1]
                self.progress("hash", done[0], total)
            return sha

        return self._map(digest, listing, threads=_worth_threads(listing))

    def _manifest(
        self, src: str, real: str, listing: list[tuple[str, int, bool]], digests: list[str],
        before: Manifest | None,
    ) -> Manifest:  # fmt: skip
        """The dataset's manifest. A file's encoding is the one its bytes were stored with
        before, if the previous version holds them (kept: the object is there); a new
        one is compressed if a sample of it shrinks by a tenth."""
        stored = {e.sha256: e.encoding for e in before.entries} if before else {}

        def entry(item: tuple[tuple[str, int, bool], str]) -> Entry:
            (path, size, exe), sha = item
            enc = stored.get(sha)
            if enc is None:
                enc = "zlib" if self.settings.compress and self._pays(real, path, size) else ""
            return Entry(path, size, sha, exe, enc)

        items = list(zip(listing, digests, strict=True))
        return Manifest.build(src, self._map(entry, items, threads=_worth_threads(listing)))

    def _pays(self, real: str, path: str, size: int) -> bool:
        if size < COMPRESS_MIN:
            return False
        sample, squeezed = self.tree.sample(real, path)
        return worth_compressing(size, sample, squeezed)

    def _previous(self, layout: Layout, old: Pointer | None) -> Manifest | None:
        """The manifest ``old`` names: the dataset's version before this push (its objects
        are stored: they came before it)."""
        if old is None:
            return None
        body = self._read(layout.manifest(old.manifest), MAX_MANIFEST_BYTES)
        return parse_manifest(body, layout.manifest(old.manifest)) if body else None

    def _missing(self, layout: Layout, candidates: list[Entry]) -> list[Entry]:
        """Those of ``candidates`` the namespace does not hold (another dataset of the
        account may hold some). Objects are sharded by their digest's first byte: a
        shard with several candidates is listed (a request per 1,000 keys), a lone
        candidate is asked for (one HEAD)."""
        shards: dict[str, list[Entry]] = {}
        for e in candidates:
            shards.setdefault(e.sha256[:2], []).append(e)

        def absent(group: list[Entry]) -> list[Entry]:
            if len(group) == 1:
                return [] if self._has(layout.object(group[0].object_name())) else group
            there = set(self._keys(layout.object(f"o/{group[0].sha256[:2]}/")))
            return [e for e in group if layout.object(e.object_name()) not in there]

        return [e for found in self._map(absent, list(shards.values())) for e in found]

    def _send(self, layout: Layout, real: str, e: Entry) -> int:
        key = layout.object(e.object_name())

        def once() -> int:
            with self.tree.body(real, e.path, e.sha256, e.encoding) as (body, size):
                return self.store.write(key, body, size, self._pace)

        try:
            return self._again(once)
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
        keys = [k for k in self._keys(layout.pointers()) if k.endswith(".json")]
        found = self._map(lambda k: self._read(k, 65536), keys)
        out = [parse_pointer(body, key) for key, body in zip(keys, found, strict=True) if body]
        return sorted(out, key=lambda p: p.src)

    def manifest(self, account: str, src: str) -> Manifest | None:
        layout = Layout(self.settings.prefix, namespace(account))
        return self._previous(layout, self._pointer(layout, src))

    def manifest_of(self, account: str, manifest_id: str) -> Manifest:
        """The manifest ``manifest_id`` of the account's namespace (what a stage stored);
        StorageError if the store does not hold it."""
        return self._manifest_at(Layout(self.settings.prefix, namespace(account)), manifest_id)

    def _manifest_at(self, layout: Layout, manifest_id: str) -> Manifest:
        key = layout.manifest(manifest_id)
        body = self._read(key, MAX_MANIFEST_BYTES)
        if not body:
            raise StorageError(f"{key}: the manifest is not in the store", "StageMissing")
        return parse_manifest(body, key)

    def node_plan(
        self, account: str, manifest: Manifest, dest: str, uid: int, gid: int,
        writable: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """What ``node/stagein.py`` is handed: where the dataset goes, whose it is, and
        each file with a read-only URL for its object (no request is made). ``writable``:
        left the user's to write (outputs brought back to resume from)."""
        layout = Layout(self.settings.prefix, namespace(account))
        return self._plan(layout, manifest, dest, uid, gid, writable)

    def _plan(
        self, layout: Layout, manifest: Manifest, dest: str, uid: int, gid: int, writable: bool
    ) -> dict[str, Any]:
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
            "writable": writable,
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

    def drop(self, account: str, src: str, manifest: Manifest, digests: Sequence[str]) -> int:
        """Delete the objects of ``manifest`` holding ``digests`` (found bad in the store,
        or sent from a file that changed on the way) and ``src``'s pointer if it names
        this version ('': none), so the next push sends them again rather than finding
        the dataset unchanged. Returns the objects deleted."""
        layout = Layout(self.settings.prefix, namespace(account))
        bad = set(digests)
        names = sorted({e.object_name() for e in manifest.entries if e.sha256 in bad})
        for name in names:
            self._again(functools.partial(self.store.delete, layout.object(name)))
        old = self._pointer(layout, src) if src else None
        if old is not None and old.manifest == manifest.id:
            self._again(lambda: self.store.delete(layout.pointer(src)))
        return len(names)

    # -- stage-out ---------------------------------------------------------------------

    def output_plan(
        self, account: str, manifest: Manifest, directory: str
    ) -> tuple[dict[str, Any], int]:
        """What ``node/stageout.py send`` is handed: the files of ``manifest`` (a version
        of a job's output directory, as the node scanned it) whose objects the account's
        namespace lacks, each with a URL that may PUT that object only, valid
        ``grant_seconds``; and the bytes to send."""
        layout = Layout(self.settings.prefix, namespace(account))
        todo = self._missing(layout, list(manifest.objects().values()))
        seconds = self.settings.grant_seconds
        files = [
            {"path": e.path, "size": e.size, "sha256": e.sha256,
             "url": self.store.grant(layout.object(e.object_name()), seconds, "PUT")}
            for e in sorted(todo, key=lambda e: (-e.size, e.path))
        ]  # fmt: skip
        plan = {"v": 1, "dir": directory, "headers": dict(self.store.upload_headers),
                "files": files}  # fmt: skip
        return plan, sum(e.size for e in todo)

    def commit(self, account: str, manifest: Manifest) -> None:
        """Record ``manifest`` (its objects are stored) and point its destination at it:
        the version a requeued job resumes from, and the one brought home."""
        layout = Layout(self.settings.prefix, namespace(account))
        self._write(layout.manifest(manifest.id), manifest.body)
        self._write(layout.pointer(manifest.src), pointer_body(manifest.src, manifest,
                                                               self.clock.now()))  # fmt: skip

    def promote(self, account: str, manifest_id: str, home: str) -> dict[str, Any]:
        """Bring the stored version ``manifest_id`` of an output home to ``home``: every
        file fetched into a work directory beside it and verified (size and SHA-256),
        then swapped in whole. One wrong file and nothing is replaced
        (``StageOutCorrupt``, naming the files). Run as the job's user."""
        if self.home is None:
            raise StagingError("no on-prem destination is set up for stage-out")
        started = self.clock.monotonic()
        layout = Layout(self.settings.prefix, namespace(account))
        manifest = self.manifest_of(account, manifest_id)
        if manifest.src != home:
            raise StagingError(f"version {manifest_id[:16]} is of {manifest.src}, not {home}")
        zipped = [e.path for e in manifest.entries if e.encoding]
        if zipped:
            raise StagingError(f"{home}: {zipped[0]} is stored compressed (not an output)")
        work = self.home.begin(home)
        bad: list[str] = []
        done = [0, 0]  # files, bytes

        def fetch(e: Entry) -> None:
            if not self._fetched_whole(layout, work, e):
                with self._lock:
                    bad.append(e.path)
            with self._lock:
                done[0] += 1
                done[1] += e.size
                self.progress("fetching", done[0], len(manifest.entries))

        try:
            self._map(fetch, list(manifest.entries))
            if bad:
                raise CorruptOutput(
                    f"{home}: {len(bad)} files came back from the store wrong or not at all "
                    f"({', '.join(sorted(bad)[:5])}{', ...' if len(bad) > 5 else ''}); "
                    "nothing was replaced", bad=sorted(bad),
                )  # fmt: skip
            atomic = self.home.finish(work, home)
        except BaseException:
            with contextlib.suppress(OSError):
                self.home.abandon(work)
            raise
        return {"home": home, "manifest": manifest.id, "files": len(manifest.entries),
                "bytes": manifest.size, "atomic": atomic,
                "seconds": round(self.clock.monotonic() - started, 3)}  # fmt: skip

    def _fetched_whole(self, layout: Layout, work: str, e: Entry) -> bool:
        assert self.home is not None
        with self.home.open_file(work, e.path, e.executable) as out:
            for _ in range(2):  # an object that comes back wrong is fetched once more
                out.seek(0)
                out.truncate()
                sha, got = hashlib.sha256(), [0]

                def sink(chunk: bytes, sha: Any = sha, got: list[int] = got) -> None:
                    got[0] += len(chunk)
                    if got[0] > e.size:
                        raise StorageError(f"{e.path}: the object is longer than the file")
                    sha.update(chunk)
                    out.write(chunk)

                try:
                    size = self._again(
                        lambda: self.store.read_into(layout.object(e.object_name()), sink)
                    )
                except StorageError:
                    continue
                if size is not None and got[0] == e.size and sha.hexdigest() == e.sha256:
                    return True
        return False

    # -- garbage collection ---------------------------------------------------------------

    def gc(
        self, keep_days: float, live: Mapping[str, set[str]], grace: float, dry_run: bool = False,
        booked: Mapping[str, float] | None = None,
    ) -> GcReport:  # fmt: skip
        """Remove what no dataset needs any more, namespace by namespace (mark, then sweep).

        A pointer written more than ``keep_days`` ago whose version no job still holds
        (``live``: namespace -> the manifest ids of the jobs the state database knows)
        goes: its dataset is sent again when next asked for. Then a manifest no pointer
        and no job names, and an object no kept manifest names, each only if written
        more than ``grace`` seconds ago (a push writes its objects, then its manifest,
        then its pointer: ``grace`` is longer than a push). Deleted pointers first, then
        manifests, then objects, so nothing left ever names what is gone. A namespace
        with a manifest that cannot be read keeps all its objects (and says so). A node
        that finds an object gone anyway (a push racing a sweep) has it sent again.

        ``booked`` (namespace -> when its storage was last booked; a namespace not in it
        never was): the report says what each namespace held and for how long since, every
        key listed counting until now, what this run removes included."""
        now = self.clock.now()
        cutoff, settled = now - keep_days * 86400, now - grace
        prefix = self.settings.prefix
        self.progress("listing", 0, 0)
        listing = self._again(lambda: list(self.store.keys(prefix)))
        by_ns: dict[str, dict[str, list[tuple[str, str, int, float]]]] = {}
        for key, size, modified in listing:
            found = stored_kind(key, prefix)
            if found is not None:
                ns, kind, name = found
                kinds = by_ns.setdefault(ns, {"o": [], "m": [], "d": []})
                kinds[kind].append((key, name, size, modified))
        report = GcReport(dry_run=dry_run, keys=len(listing), at=now)
        doomed: dict[str, list[tuple[str, int]]] = {"d": [], "m": [], "o": []}
        for ns, kinds in sorted(by_ns.items()):
            layout = Layout(prefix, ns)
            if booked is not None:
                report.held[ns] = _held(kinds, booked.get(ns), now)
            held = live.get(ns, set())
            row = report.namespace(ns)
            keep = set(held)
            for key, _name, size, modified in kinds["d"]:
                body = self._read(key, 65536)
                try:
                    p = parse_pointer(body, key) if body else None
                except StagingError:
                    p = None
                stale = p is None and modified < settled  # not a pointer: once settled
                expired = (p is not None and p.at < cutoff and modified < cutoff
                           and p.manifest not in held)  # fmt: skip
                if stale or expired:
                    doomed["d"].append((key, size))
                    row["pointers"] += 1
                elif p is not None:
                    keep.add(p.manifest)
            present = {name for _key, name, _size, _at in kinds["m"]}
            for key, name, size, modified in kinds["m"]:
                if name not in keep and modified < settled:
                    doomed["m"].append((key, size))
                    row["manifests"] += 1
            needed: set[str] = set()
            unreadable = []
            for i, mid in enumerate(sorted(keep & present)):
                self.progress(f"reading {ns}'s manifests", i, len(keep & present))
                key = layout.manifest(mid)
                try:
                    body = self._read(key, MAX_MANIFEST_BYTES)
                    if body:
                        needed.update(parse_manifest(body, key).objects())
                except StagingError as exc:
                    unreadable.append(str(exc)[:200])
            if unreadable:
                report.problems.extend(unreadable)
            for key, name, size, modified in kinds["o"]:
                if not unreadable and name not in needed and modified < settled:
                    doomed["o"].append((key, size))
                    row["objects"] += 1
                    row["bytes_freed"] += size
                else:
                    row["objects_kept"] += 1
                    row["bytes_kept"] += size
        if not dry_run:
            for kind in ("d", "m", "o"):  # what names comes down before what it names
                self._delete_all(_KINDS[kind], [key for key, _size in doomed[kind]])
        return report

    def _delete_all(self, what: str, keys: list[str]) -> None:
        done = 0

        def delete(key: str) -> None:
            nonlocal done
            self._again(functools.partial(self.store.delete, key))
            with self._lock:
                done += 1
                self.progress(f"deleting {what}", done, len(keys))

        self._map(delete, keys)

    # -- helpers -----------------------------------------------------------------------

    def _pointer(self, layout: Layout, src: str) -> Pointer | None:
        body = self._read(layout.pointer(src), 65536)
        return parse_pointer(body, layout.pointer(src)) if body else None

    def _read(self, key: str, limit: int) -> bytes | None:
        return self._again(lambda: self.store.read(key, limit))

    def _keys(self, prefix: str) -> list[str]:
        keys = self._again(lambda: [k for k, _, _ in self.store.keys(prefix)])
        with self._lock:
            self._requests += len(keys) // 1000  # S3 lists 1,000 keys a page
        return keys

    def _has(self, key: str) -> bool:
        return self._again(lambda: self.store.has(key))

    def _write(self, key: str, body: bytes) -> int:
        return self._again(lambda: self.store.write_bytes(key, body))

    def _again(self, call: Callable[[], R]) -> R:
        """``call`` (one request), made again after a failure worth another (the store's
        5xx, SlowDown, no answer) with full-jitter backoff, ``attempts`` times at most."""
        for attempt in range(self.settings.attempts):
            with self._lock:
                self._requests += 1
            try:
                return call()
            except StorageError as exc:
                if not exc.retryable or attempt + 1 >= self.settings.attempts:
                    raise
                self.clock.sleep(backoff(attempt, 0.2, 5.0, self.rand()))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _map(self, fn: Callable[[T], R], items: Sequence[T], threads: bool = True) -> list[R]:
        if not threads or len(items) <= 1 or self.settings.transfers <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(self.settings.transfers, thread_name_prefix="stage") as pool:
            return list(pool.map(fn, items))

    def _pushed(
        self, src: str, real: str, account: str, manifest: Manifest, objects_sent: int,
        bytes_sent: int, started: float, unchanged: bool = False,
    ) -> Pushed:  # fmt: skip
        return Pushed(
            src=src, real_src=real, account=account, manifest=manifest.id,
            files=len(manifest.entries), bytes=manifest.size, objects=len(manifest.objects()),
            objects_sent=objects_sent, bytes_sent=bytes_sent, requests=self._requests,
            seconds=round(self.clock.monotonic() - started, 3), unchanged=unchanged,
        )  # fmt: skip


def _worth_threads(listing: Sequence[tuple[str, int, bool]]) -> bool:
    """Hash in threads when files are large: hashlib and zlib let go of the GIL only
    for the bytes they work on, so 10,000 files of 16 KiB hash faster in one thread."""
    return bool(listing) and sum(size for _, size, _ in listing) >= len(listing) * 256 * 1024


def _held(kinds: Mapping[str, list[tuple[str, str, int, float]]], since: float | None,
          now: float) -> Held:  # fmt: skip
    sized = [(size, at) for keys in kinds.values() for _key, _name, size, at in keys]
    return Held(len(sized), sum(size for size, _at in sized),
                stored_byte_seconds(sized, since, now), since)  # fmt: skip
