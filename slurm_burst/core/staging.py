"""Data that follows the job: what a stage-in asks for, and how a dataset is stored.

A job asks in its batch script, in the words of Slurm's ``burst_buffer/lua`` plugin::

    #BB_LUA stage_in src=/data/imagenet dst=imagenet

``src`` is an absolute path on the site's side; ``dst`` a name the job finds its copy
under on the node (``$SLURM_BURST_STAGE/imagenet``). Outputs go the other way::

    #BB_LUA stage_out src=ckpt dst=/results/%j sync=600

``$SLURM_BURST_STAGE/ckpt`` on the job's first node is synced every 600 s while the job
runs, and once more after it ends, before the node is released; it lands on-prem at
``/results/<job id>``, verified, replacing what was there whole. Values hold no blanks
or quotes: the same line is read by the Lua hook inside slurmctld, which splits on
blanks.

A dataset is stored content-addressed in one bucket, under a namespace per Slurm
account, so two files with the same bytes in one account are stored once, and nothing
about one account's data can be learned from another's (a namespace never answers for
another's objects)::

    <prefix>/<ns>/o/<sha256[:2]>/<sha256>      a file's bytes as they are
    <prefix>/<ns>/o/<sha256[:2]>/<sha256>.z    a file's bytes, zlib-compressed
    <prefix>/<ns>/m/<manifest id>.json         one version of a dataset: every file
    <prefix>/<ns>/d/<dataset id>.json          a dataset's newest version (a pointer)

A manifest is canonical JSON (sorted, no blanks); its id is the SHA-256 of those bytes,
so the same tree always gives the same id, and a re-stage of an unchanged tree is one
read of the pointer. Objects are written before the manifest that names them, and the
manifest before the pointer: whatever a pointer names is whole.

Pure: no I/O; the scanner, the store and the node's fetcher do that.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from slurm_burst.core.errors import EXIT_PRECONDITION, BadInput, BurstError
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.slurmsyntax import is_name, visible

DIRECTIVE = "#BB_LUA"  # burst_buffer.conf's Directive; Slurm's default for burst_buffer/lua
MANIFEST_VERSION = 1
MAX_FILES = 1_000_000  # files in one dataset
MAX_PATH = 4096  # bytes of a file's path inside a dataset
MAX_COMPONENT = 255  # bytes of one name (NAME_MAX)
MAX_MANIFEST_BYTES = 256 * 1024 * 1024  # a manifest read back from the store
MAX_FILE_BYTES = 5 * 1024**4  # S3's largest object
COMPRESS_MIN = 4096  # smaller files are stored as they are
COMPRESS_RATIO = 0.9  # compressed where it saves at least a tenth

_WORD = re.compile(r"[^ \t\n\r\v\f]+")  # a blank is what C's isspace says
_DST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
_SHA = re.compile(r"[0-9a-f]{64}", re.ASCII)
_SRC = re.compile(r"/[A-Za-z0-9._+@/,=:~-]*", re.ASCII)  # no blank, quote or shell character
_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}", re.ASCII)
ENCODINGS = ("", "zlib")


class StagingError(BadInput):
    """A stage request, a dataset or a manifest that cannot be used (says what and where)."""

    code = "StageBadInput"


class SensitiveData(StagingError):
    """Data the site keeps on-prem was asked to leave (names the rule that keeps it)."""

    code = "StageSensitive"


class StorageError(BurstError):
    """The object store failed or refused; ``code`` is the store's own where it gave one
    (``AccessDenied``, ``NoSuchBucket``), else ``StorageError`` or ``StorageUnreachable``."""

    code = "StorageError"

    def __init__(self, message: str = "", code: str | None = None, retryable: bool = False) -> None:
        super().__init__(message, code)
        self.retryable = retryable  # the store's 5xx, SlowDown, a timeout: worth again


class CorruptOutput(StorageError):
    """A stored version of an output whose files came back wrong: never brought home.
    ``bad``: their paths in the version."""

    code = "StageOutCorrupt"

    def __init__(self, message: str, bad: Sequence[str] = ()) -> None:
        super().__init__(message, self.code)
        self.bad = list(bad)

    @classmethod
    def said(cls, code: str, message: str, bad: object) -> CorruptOutput | None:
        """This error again from what a child process said of it (its code, message and
        ``bad`` list); None where it said another."""
        if code != cls.code or not isinstance(bad, list):
            return None
        return cls(message, [p for p in bad if isinstance(p, str)][:100_000])


class StorageUnavailable(StorageError):
    """No store is configured for what was asked (names the provider or the store)."""

    code = "StorageUnavailable"
    exit_code = EXIT_PRECONDITION


@dataclass(frozen=True)
class StageIn:
    """One ``stage_in`` directive: copy ``src`` (on-prem) to ``dst`` on the job's nodes."""

    src: str
    dst: str
    line: int = 0  # of the batch script (0: not from a script)


def check_src(src: str, where: str = "src") -> str:
    """An absolute, normalized on-prem path of Slurm-safe characters; returned as is."""
    shown = repr(src) if len(src) <= 120 else f"{src[:100]!r}... ({len(src)} characters)"
    if not _SRC.fullmatch(src) or len(src) > MAX_PATH:
        raise StagingError(
            f"{where}={shown}: an absolute path of letters, digits and ._+@/,=:~- "
            f"(no blanks or quotes), at most {MAX_PATH} bytes"
        )
    parts = src.split("/")[1:]
    if src != "/" and (src.endswith("/") or any(p in ("", ".", "..") for p in parts)):
        raise StagingError(
            f"{where}={shown}: not a normalized path (no //, '.', '..' or trailing /)"
        )
    return src


def check_dst(dst: str, where: str = "dst") -> str:
    if not _DST.fullmatch(dst):
        raise StagingError(
            f"{where}={dst!r}: a name of letters, digits and ._- (at most 64, not starting "
            "with . or -)"
        )
    return dst


MAX_STAGES = 32  # stage_in and stage_out directives in one job
MAX_LINE = 8192  # bytes of one directive line (a path is at most MAX_PATH)
# bytes of a script's header read (its lines up to the first that is not a comment):
# slurmctld runs the Lua hook holding its locks, and what it scans is what it costs
MAX_HEADER = 64 * 1024
_HEADER_ENDS = re.compile(rb"\n[^#\n]")
SYNC_MIN, SYNC_MAX = 10, 7 * 86400  # seconds between a stage-out's syncs (0: at job end only)
JOB_ID = "%j"  # in a stage-out's dst: the job's id (the same after a requeue)


@dataclass(frozen=True)
class StageOut:
    """One ``stage_out`` directive: the job's directory ``src`` on its first node (next to
    its staged data: ``$SLURM_BURST_STAGE/<src>``) goes home to ``dst`` (on-prem, ``%j``
    the job id), every ``sync`` seconds while the job runs (0: only once it ended) and
    whole once it ended, before the node is released."""

    src: str
    dst: str  # as written: may hold %j
    sync: int = 0
    line: int = 0

    def home(self, job_id: int) -> str:
        """The on-prem path of this output for job ``job_id``."""
        return self.dst.replace(JOB_ID, str(int(job_id)))


@dataclass(frozen=True)
class Stages:
    """A batch script's stage directives, each list in the script's order."""

    ins: tuple[StageIn, ...] = ()
    outs: tuple[StageOut, ...] = ()


def parse_stages(script: str, directive: str = DIRECTIVE) -> Stages:
    """Every ``stage_in`` and ``stage_out`` of a batch script, in order, read as Slurm
    reads its header: lines split at newlines, empty ones skipped, directives stop at the
    first line that does not start with '#'. A word that starts like the directive but is
    not it (``#BB_LUAX``), or another burst-buffer word, is refused by name, so a typo is
    not a stage silently skipped. The names on the node (a stage-in's ``dst``, a
    stage-out's ``src``) are one namespace. The Lua hook inside slurmctld
    (``burst_buffer.lua``) applies the same rules. Raises :class:`StagingError` naming
    the line."""
    raw = script.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_HEADER:  # read no further than the hook does
        head = raw[:MAX_HEADER]
        if head[:1] in (b"#", b"\n") and _HEADER_ENDS.search(head) is None:
            raise StagingError(header_too_long(directive))
        script = head.decode("utf-8", "surrogateescape")
    ins: list[StageIn] = []
    outs: list[StageOut] = []
    names: dict[str, int] = {}
    for number, line in enumerate(script.split("\n"), 1):
        if not line:
            continue
        if not line.startswith("#"):
            break
        if not line.startswith(directive):  # never split: what the Lua skips unread
            continue
        where = f"line {number}"
        size = len(line.encode("utf-8", "surrogateescape"))
        if size > MAX_LINE:
            raise StagingError(f"{where}: a {directive} line of {size} bytes (at most {MAX_LINE})")
        # the first six words: a stage has at most five, so a sixth is an error already
        words = [m.group() for m in itertools.islice(_WORD.finditer(line), 6)]
        if words[0] != directive:
            raise StagingError(f"{where}: {words[0][:40]!r} is not {directive}")
        if len(words) == 1:
            raise StagingError(f"{where}: {directive} with nothing after it")
        verb = words[1]
        if verb not in ("stage_in", "stage_out"):
            raise StagingError(
                f"{where}: {verb[:40]!r} is not a stage slurm-burst knows (stage_in, stage_out)"
            )
        args = _arguments(verb, words[2:], where)
        if verb == "stage_in":
            src = check_src(args["src"], f"{where}: src")
            name = check_dst(args["dst"], f"{where}: dst")
            ins.append(StageIn(src, name, number))
        else:
            name = check_dst(args["src"], f"{where}: src")
            outs.append(StageOut(name, check_home(args["dst"], f"{where}: dst"),
                                 _sync(args.get("sync", "0"), where), number))  # fmt: skip
        if name in names:
            raise StagingError(f"{where}: {name} is also line {names[name]}'s")
        if len(names) == MAX_STAGES:
            raise StagingError(f"{where}: more than {MAX_STAGES} stage directives")
        names[name] = number
    return Stages(tuple(ins), tuple(outs))


def header_too_long(directive: str) -> str:
    return (
        f"the script's header (its lines up to the first that is not a comment) runs past "
        f"{MAX_HEADER} bytes, which is all slurm-burst reads of it: shorten the comments "
        f"above the commands (and keep the {directive} lines in them)"
    )


_USAGE = {"stage_in": "src=PATH dst=NAME", "stage_out": "src=NAME dst=PATH [sync=SECONDS]"}


def _arguments(verb: str, words: Sequence[str], where: str) -> dict[str, str]:
    allowed = ("src", "dst", "sync") if verb == "stage_out" else ("src", "dst")
    args: dict[str, str] = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or key not in allowed:
            raise StagingError(f"{where}: {w[:60]!r}: {verb} takes {_USAGE[verb]}")
        if key in args:
            raise StagingError(f"{where}: {key}= given twice")
        args[key] = value
    missing = [k for k in ("src", "dst") if k not in args]
    if missing:
        raise StagingError(f"{where}: {verb} needs {' and '.join(m + '=' for m in missing)}")
    return args


def check_home(dst: str, where: str = "dst") -> str:
    """A stage-out's on-prem path: what :func:`check_src` takes, where ``%j`` may stand
    for the job id; not ``/`` (a stage-out replaces its destination)."""
    check_src(dst.replace(JOB_ID, "0"), where)
    if dst == "/":
        raise StagingError(f"{where}=/: a stage-out replaces its destination, not /")
    return dst


def _sync(value: str, where: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 7) or not (
        int(value) == 0 or SYNC_MIN <= int(value) <= SYNC_MAX
    ):
        raise StagingError(
            f"{where}: sync={value[:20]!r}: 0 (at the end only) or {SYNC_MIN} to {SYNC_MAX} seconds"
        )
    return int(value)


def check_relpath(path: str, where: str) -> str:
    """A file's path inside a dataset: relative, '/'-separated, no '.', '..' or empty
    name, printable, at most :data:`MAX_PATH` bytes (what a node may safely create)."""
    data = path.encode("utf-8", "surrogateescape")
    parts = path.split("/")
    bad = (
        not path
        or len(data) > MAX_PATH
        or path.startswith("/")
        or any(
            p in ("", ".", "..") or len(p.encode("utf-8", "surrogateescape")) > MAX_COMPONENT
            for p in parts
        )
        or not path.isprintable()
    )
    if bad:
        raise StagingError(f"{where}: {path!r} is not a path a dataset may hold")
    return path


@dataclass(frozen=True, order=True)
class Entry:
    """One regular file of a dataset."""

    path: str  # relative, '/'-separated
    size: int
    sha256: str  # of the file's own bytes
    executable: bool = False
    encoding: str = ""  # how it is stored: "" as is, "zlib"

    def object_name(self) -> str:
        """The object's name inside a namespace."""
        return f"o/{self.sha256[:2]}/{self.sha256}" + (".z" if self.encoding == "zlib" else "")


@dataclass(frozen=True)
class Manifest:
    """One version of a dataset: its source and every file, sorted by path."""

    src: str
    entries: tuple[Entry, ...]
    body: bytes = field(default=b"", compare=False, repr=False)

    @staticmethod
    def build(src: str, entries: Iterable[Entry]) -> Manifest:
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        for a, b in itertools.pairwise(ordered):
            if a.path == b.path:
                raise StagingError(f"dataset {src}: {a.path!r} listed twice")
            if b.path.startswith(a.path + "/"):
                raise StagingError(f"dataset {src}: {a.path!r} is a file and a directory")
        if len(ordered) > MAX_FILES:
            raise StagingError(f"dataset {src}: {len(ordered)} files (at most {MAX_FILES:,})")
        doc = {
            "v": MANIFEST_VERSION,
            "src": src,
            "files": [[e.path, e.size, e.sha256, int(e.executable), e.encoding] for e in ordered],
        }
        body = json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=True).encode()
        return Manifest(src, ordered, body)

    @property
    def id(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def objects(self) -> dict[str, Entry]:
        """Its distinct objects: object name -> the first entry storing it."""
        out: dict[str, Entry] = {}
        for e in self.entries:
            out.setdefault(e.object_name(), e)
        return out


def parse_manifest(body: bytes, where: str) -> Manifest:
    """A manifest read back (from the store, or handed to a node), checked whole: every
    path, size, digest and encoding, and that it is the canonical form of itself."""
    if len(body) > MAX_MANIFEST_BYTES:
        raise StagingError(f"{where}: manifest over {MAX_MANIFEST_BYTES} bytes")
    try:
        doc = read_json(body, f"{where}: manifest", max_bytes=MAX_MANIFEST_BYTES)
        if doc["v"] != MANIFEST_VERSION:
            raise StagingError(
                f"{where}: manifest version {doc['v']!r} (this is {MANIFEST_VERSION})"
            )
        src = check_src(doc["src"], f"{where}: src")
        entries = [_entry(row, f"{where}: file {i + 1}") for i, row in enumerate(doc["files"])]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise StagingError(f"{where}: not a manifest ({type(exc).__name__}: {exc})") from None
    manifest = Manifest.build(src, entries)
    if manifest.body != body:
        raise StagingError(f"{where}: manifest is not in canonical form")
    return manifest


def _entry(row: object, where: str) -> Entry:
    if not isinstance(row, list) or len(row) != 5:
        raise StagingError(f"{where}: not [path, size, sha256, executable, encoding]")
    path, size, sha, exe, enc = row
    check_relpath(path if isinstance(path, str) else "", where)
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        raise StagingError(f"{where}: size {size!r}")
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise StagingError(f"{where}: sha256 {sha!r}")
    if exe not in (0, 1) or type(exe) is not int or enc not in ENCODINGS:
        raise StagingError(f"{where}: executable {exe!r} or encoding {enc!r}")
    return Entry(path, size, sha, bool(exe), enc)


def namespace(account: str) -> str:
    """The store namespace of a Slurm account (accounts are lower-cased by Slurm)."""
    ns = account.lower()
    if not _NAMESPACE.fullmatch(ns):
        raise StagingError(f"account {account!r}: not a Slurm account name")
    return f"acct-{ns}"


def account_of(ns: str) -> str:
    """The Slurm account a store namespace is of ('' if it is not an account's)."""
    account = ns.removeprefix("acct-")
    return account if ns != account and _NAMESPACE.fullmatch(account) else ""


def dataset_id(ns: str, src: str) -> str:
    return hashlib.sha256(f"{ns}\0{src}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Layout:
    """Where a namespace's objects, manifests and pointers are in the bucket."""

    prefix: str  # "" or "slurm-burst/" (ends with '/')
    ns: str

    def object(self, name: str) -> str:
        return f"{self.prefix}{self.ns}/{name}"

    def manifest(self, manifest_id: str) -> str:
        return f"{self.prefix}{self.ns}/m/{manifest_id}.json"

    def pointer(self, src: str) -> str:
        return f"{self.prefix}{self.ns}/d/{dataset_id(self.ns, src)}.json"

    def pointers(self) -> str:
        return f"{self.prefix}{self.ns}/d/"


_STORED = re.compile(
    r"(acct-[a-z0-9][a-z0-9_-]{0,62})/"
    r"(?:(o/[0-9a-f]{2}/[0-9a-f]{64}(?:\.z)?)|m/([0-9a-f]{64})\.json|(d/[0-9a-f]{32}\.json))",
    re.ASCII,
)


def stored_kind(key: str, prefix: str) -> tuple[str, str, str] | None:
    """What a key of the bucket is to staging: (namespace, kind, name) with kind ``o``
    (an object; name its object name), ``m`` (a manifest; its id) or ``d`` (a pointer;
    its name); None for any other key, which staging never touches."""
    if not key.startswith(prefix):
        return None
    m = _STORED.fullmatch(key[len(prefix) :])
    if m is None:
        return None
    if m[2]:
        return m[1], "o", m[2]
    if m[3]:
        return m[1], "m", m[3]
    return m[1], "d", m[4]


def pointer_body(src: str, manifest: Manifest, at: float) -> bytes:
    doc = {"src": src, "manifest": manifest.id, "files": len(manifest.entries),
           "bytes": manifest.size, "at": round(at, 3)}  # fmt: skip
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Pointer:
    src: str
    manifest: str
    files: int
    bytes: int
    at: float


def parse_pointer(body: bytes, where: str) -> Pointer:
    try:
        doc = read_json(body, f"{where}: pointer", max_bytes=65536)
        p = Pointer(doc["src"], doc["manifest"], doc["files"], doc["bytes"], doc["at"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StagingError(f"{where}: not a dataset pointer ({type(exc).__name__})") from None
    check_src(p.src, f"{where}: src")
    if not (isinstance(p.manifest, str) and _SHA.fullmatch(p.manifest)):
        raise StagingError(f"{where}: manifest id {p.manifest!r}")
    for name in ("files", "bytes"):
        value = getattr(p, name)
        if type(value) is not int or value < 0:
            raise StagingError(f"{where}: {name} {value!r}")
    if not isinstance(p.at, int | float) or not 0 <= p.at < 2**40:
        raise StagingError(f"{where}: at {p.at!r}")
    return p


def to_send(manifest: Manifest, stored: Iterable[str]) -> list[Entry]:
    """The objects of ``manifest`` the store does not hold (``stored``: object names
    known to be there), each once, largest first (the long uploads start first)."""
    have = set(stored)
    todo = [e for name, e in manifest.objects().items() if name not in have]
    return sorted(todo, key=lambda e: (-e.size, e.path))


def worth_compressing(size: int, sample_in: int, sample_out: int) -> bool:
    """Store compressed when a sample of the file shrinks by at least a tenth."""
    return size >= COMPRESS_MIN and sample_in > 0 and sample_out <= sample_in * COMPRESS_RATIO


@dataclass(frozen=True)
class KeptHome:
    """What the site keeps on-prem: paths as configured (normalized absolute paths),
    Slurm accounts and QOS (compared without regard to case, as Slurm compares them)."""

    paths: tuple[str, ...] = ()
    accounts: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()

    def resolved(self, real: Callable[[str], str]) -> KeptHome:
        """These rules with each path also in its resolved spelling (``real``: every
        symlink followed, now): a site's ``/data -> /mnt/data`` keeps both. The daemon
        resolves them at every check, since a site may move a mount."""
        paths = [spelling for p in self.paths for spelling in (p, real(p))]
        return replace(self, paths=tuple(dict.fromkeys(paths)))


MAX_SPELLINGS = 64


def path_spellings(
    path: str,
    real: Callable[[str], str],
    links_in: Callable[[str], Sequence[tuple[str, str]]],
) -> tuple[str, ...]:
    """Every spelling of the kept ``path`` a job could write that leads to it: as
    configured, resolved (``real``), and through each symlink found in a directory
    above one of them whose target is the resolved path or a directory above it
    (``links_in(dir)``: (link, its resolved target) of the symlinks directly in
    ``dir``). A site's ``/data -> /mnt/data`` gives both, whichever is configured.
    For burst_buffer.lua, which has no realpath and compares paths lexically; at most
    :data:`MAX_SPELLINGS`. Pure: the two lookups are passed in."""
    target = real(path)
    on_the_way = {target, *_ancestors(target)}  # what a link may lead to
    found = list(dict.fromkeys([path, target]))
    for spelling in found:  # grows as links are found; bounded below
        for above in _ancestors(spelling):
            for link, to in links_in(above):
                if to in on_the_way:
                    rest = target[len(to):].lstrip("/")  # fmt: skip
                    new = f"{link.rstrip('/')}/{rest}" if rest else link
                    if new not in found and len(found) < MAX_SPELLINGS:
                        found.append(new)
    return tuple(found)


def _ancestors(path: str) -> list[str]:
    """The directories above the absolute ``path``, nearest first, "/" last."""
    out = []
    while path not in ("/", ""):
        path = path.rsplit("/", 1)[0] or "/"
        out.append(path)
    return out


def kept_home(real_src: str, account: str, qos: str, rules: KeptHome) -> str | None:
    """Why this stage may not leave the site (None: it may). ``real_src`` is the source
    with every symlink and '..' resolved, compared with every spelling of each kept path
    (:meth:`KeptHome.resolved`). An account or QOS that is not a Slurm name is refused:
    no spelling of a kept name (a case, a trailing control character) passes."""
    for kind, name, kept in (("account", account, rules.accounts), ("QOS", qos, rules.qos)):
        if not name:
            continue
        if not is_name(name):
            return f"{kind} {visible(name[:70])} is not a Slurm {kind} name"
        if name.lower() in {k.lower() for k in kept}:
            return f"{kind} {name} keeps its data on-prem"
    for path in rules.paths:
        if real_src == path or real_src.startswith(path.rstrip("/") + "/") or path == "/":
            return f"{real_src} is under {path}, which stays on-prem"
    return None


def output_dir(node_dir: str, job_id: int, name: str) -> str:
    """Where a job's output ``name`` is on its node (``$SLURM_BURST_STAGE_<NAME>``)."""
    return f"{node_dir.rstrip('/')}/{int(job_id)}/{name}"


def stage_env(stages: Sequence[StageIn], root: str) -> Mapping[str, str]:
    """The job's environment: ``SLURM_BURST_STAGE`` (the job's stage directory) and one
    ``SLURM_BURST_STAGE_<DST>`` per stage (dst upper-cased, '.' and '-' as '_')."""
    env = {"SLURM_BURST_STAGE": root}
    for s in stages:
        env["SLURM_BURST_STAGE_" + re.sub(r"[.-]", "_", s.dst.upper())] = f"{root}/{s.dst}"
    return env


def output_manifest(home: str, scanned: object, where: str) -> Manifest:
    """A version of a job's output directory, from ``node/stageout.py scan``'s ``files``
    ([path, size, sha256, executable] each), checked whole as a manifest read from a
    store is: the node's answer is not trusted more than the store's."""
    if not isinstance(scanned, list):
        raise StagingError(f"{where}: the scan's files are not a list")
    entries = []
    for i, row in enumerate(scanned):
        ok = isinstance(row, list) and len(row) == 4 and type(row[3]) is bool
        entries.append(_entry([*row[:3], int(row[3]), ""] if ok else row, f"{where}: file {i + 1}"))
    return Manifest.build(check_src(home, f"{where}: home"), entries)
