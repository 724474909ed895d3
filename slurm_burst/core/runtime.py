"""The runtime manifest: what a node runs (OS, kernel, C library, GPU driver and CUDA,
NCCL, MPI, the site's listed libraries, Python packages and container images), captured
on an on-prem reference node and compared with each burst node before its slurmd starts.

A manifest is a flat map of fields, each of a class: ``os``, ``kernel``, ``glibc``,
``driver``, ``cuda_driver`` (the highest CUDA the driver supports, NVML's),
``cuda_runtime`` (libcudart's), ``nccl``, ``mpi`` (``openmpi 4.1.4``), ``python``
(``3.11.2``), and one field per listed item: ``library:<soname>`` (its file and SHA-256),
``package:<name>`` (its version), ``image:<name>`` (its digest). A value of ``""`` means
"not on this node"; a field the reference does not have was not captured there and is
not compared (an image has no kernel).

:func:`compare` gives every field that differs, each judged by the group's rule:

- ``exact``: every captured field equal.
- ``compatible``: a difference passes where the component's own compatibility promise
  covers it, and only there. Each rule and its source, in :data:`RULES`:

  ================ ==================================================================
  os               same distribution and release (ID, VERSION_ID of os-release): a
                   release is the ABI its packages are built against
  kernel           same major.minor: a stable series only takes fixes
                   (Linux's Documentation/process/stable-kernel-rules.rst)
  glibc            same major, node's at least the reference's: symbol versioning
                   runs what an older glibc built on a newer one, never the reverse
  driver           node's at least the reference's: a newer driver runs what an older
                   one ran (NVIDIA, CUDA Compatibility, "backward compatibility")
  cuda_driver      node's at least the reference's (the same promise)
  cuda_runtime     same major, node's minor at least the reference's (CUDA
                   Compatibility, "minor version compatibility", CUDA 11 and later)
  nccl             same major.minor: ranks of one job must not mix NCCL series
  mpi              same implementation and release series (major.minor): Open MPI
                   and MPICH support one version across a job's processes
  python           same major.minor: extension modules are built per minor
                   (CPython's ABI tag, PEP 3149)
  library          same file (the soname's full version); a rebuild's digest may
                   differ
  package          same version: PEP 440 versions promise nothing across releases
  image            same digest, always: a digest names the content
  ================ ==================================================================

A value that does not parse as the rule's version compares as ``exact``. A field only
the node has passes under ``compatible`` (nothing the reference runs needs it) and not
under ``exact``. Pure: stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_burst.core.errors import BadInput
from slurm_burst.core.images import is_digest

SCHEMA = 1
RULE_NAMES = ("exact", "compatible")
SCALARS = (
    "os",
    "kernel",
    "glibc",
    "driver",
    "cuda_driver",
    "cuda_runtime",
    "nccl",
    "mpi",
    "python",
)
LISTS = {"libraries": "library", "packages": "package", "images": "image"}
LIVE_ONLY = ("kernel", "driver", "cuda_driver")  # what a running node has, an image not
META = ("host", "captured_at", "source", "python_path")
MAX_ITEMS = 4096  # listed libraries, packages or images in one manifest
MAX_TEXT = 512
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@:/-]{0,255}", re.ASCII)
_PATH = re.compile(r"/[A-Za-z0-9._+/-]{1,255}", re.ASCII)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)
_VERSION = re.compile(r"(\d+(?:\.\d+)*)")

RULES: dict[str, str] = {
    "os": "same distribution and release (its packages' ABI)",
    "kernel": "same major.minor (a stable series takes only fixes)",
    "glibc": "same major, node's not older (symbol versioning runs older builds)",
    "driver": "node's not older (NVIDIA drivers run what older ones ran)",
    "cuda_driver": "node's not older (NVIDIA drivers run what older ones ran)",
    "cuda_runtime": "same major, node's minor not older (CUDA minor version compatibility)",
    "nccl": "same major.minor (one NCCL series across a job's ranks)",
    "mpi": "same implementation and release series (one MPI across a job)",
    "python": "same major.minor (extension modules are built per minor)",
    "library": "same file, its soname's full version (a rebuild may differ in digest)",
    "package": "same version",
    "image": "same digest",
}


class ManifestError(BadInput, ValueError):
    """A manifest that does not read: says which field and why."""

    code = "BadRuntimeManifest"


@dataclass(frozen=True)
class Manifest:
    """One node's (or image's) runtime: ``fields`` by name (see the module's doc)."""

    fields: Mapping[str, str]
    host: str = ""
    captured_at: str = ""
    source: str = ""  # "node", "image DIR"
    python_path: str = ""  # the interpreter whose version and packages it holds


@dataclass(frozen=True)
class Difference:
    field: str
    reference: str  # "" not there
    found: str  # "" not there
    ok: bool  # within the rule
    why: str

    def line(self) -> str:
        ref, got = self.reference or "(none)", self.found or "(none)"
        return f"{self.field}: {ref} -> {got}"


def field_class(name: str) -> str:
    return name.split(":", 1)[0]


def compare(reference: Manifest, node: Manifest, rule: str) -> list[Difference]:
    """Every field that differs between ``reference`` and ``node``, judged by ``rule``
    (``exact`` or ``compatible``), in the reference's field order, then the node's
    own extra fields."""
    if rule not in RULE_NAMES:
        raise ValueError(f"runtime rule {rule!r}: must be one of {', '.join(RULE_NAMES)}")
    out = []
    for name, want in reference.fields.items():
        got = node.fields.get(name)
        if got is None and node.source.startswith("image") and name in LIVE_ONLY:
            out.append(Difference(name, want, "", True, "an image has none: not compared"))
        elif got is None:
            out.append(Difference(name, want, "", False, "not captured on the node"))
        elif got != want:
            ok = rule == "compatible" and _compatible(field_class(name), want, got)
            out.append(
                Difference(
                    name, want, got, ok, "exact" if rule == "exact" else RULES[field_class(name)]
                )
            )
    for name, got in node.fields.items():
        if (
            name not in reference.fields
            and got
            and field_class(name) in ("library", "package", "image")
        ):
            out.append(Difference(name, "", got, rule == "compatible", "not in the reference"))
    return out


def mismatches(diffs: list[Difference]) -> list[Difference]:
    return [d for d in diffs if not d.ok]


def _compatible(cls: str, want: str, got: str) -> bool:
    if not want or not got:
        return cls in ("library", "package", "image") and not want  # only the node has it
    if cls in ("os", "package", "image"):
        return False
    if cls == "library":
        return want.split(" ", 1)[0] == got.split(" ", 1)[0]
    if cls == "mpi":
        w_impl, _, w_ver = want.partition(" ")
        g_impl, _, g_ver = got.partition(" ")
        return w_impl == g_impl and _same_prefix(w_ver, g_ver, 2)
    if cls in ("kernel", "nccl", "python"):
        return _same_prefix(want, got, 2)
    w, g = _version(want), _version(got)
    if w is None or g is None:
        return False
    if cls in ("driver", "cuda_driver"):
        return g >= w
    if cls in ("glibc", "cuda_runtime"):
        return g[:1] == w[:1] and g >= w
    return False


def _version(text: str) -> tuple[int, ...] | None:
    m = _VERSION.match(text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _same_prefix(want: str, got: str, parts: int) -> bool:
    w, g = _version(want), _version(got)
    return w is not None and g is not None and len(w) >= parts and w[:parts] == g[:parts]


# -- reading and writing -----------------------------------------------------------


def to_document(m: Manifest) -> dict[str, Any]:
    """``m`` as the JSON object ``runtime capture`` writes."""
    doc: dict[str, Any] = {"slurm_burst_runtime": SCHEMA}
    if m.host:
        doc["host"] = m.host
    if m.captured_at:
        doc["captured_at"] = m.captured_at
    if m.source:
        doc["source"] = m.source
    if m.python_path:
        doc["python_path"] = m.python_path
    for name in SCALARS:
        if name in m.fields:
            doc[name] = m.fields[name]
    for key, cls in LISTS.items():
        items = {n.split(":", 1)[1]: v for n, v in m.fields.items() if field_class(n) == cls}
        if items:
            doc[key] = dict(sorted(items.items()))
    return doc


def from_document(doc: Any, where: str) -> Manifest:
    """A manifest from its parsed JSON; :class:`ManifestError` naming ``where`` and the
    field that is wrong. Every value is bounded, printable text."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: not a runtime manifest (a JSON object)")
    if doc.get("slurm_burst_runtime") != SCHEMA:
        raise ManifestError(
            f"{where}: not a runtime manifest of schema {SCHEMA} "
            f"(slurm_burst_runtime is {doc.get('slurm_burst_runtime')!r})"
        )
    unknown = set(doc) - {"slurm_burst_runtime", *META, *SCALARS, *LISTS}
    if unknown:
        raise ManifestError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    fields: dict[str, str] = {}
    for name in SCALARS:
        if name in doc:
            fields[name] = _text(doc[name], f"{where}: {name}")
    for key, cls in LISTS.items():
        items = doc.get(key, {})
        if not isinstance(items, dict):
            raise ManifestError(f"{where}: {key} must be an object of name: value")
        if len(items) > MAX_ITEMS:
            raise ManifestError(f"{where}: {key} lists {len(items):,} entries, over {MAX_ITEMS:,}")
        for name, value in items.items():
            if not _NAME.fullmatch(name):
                raise ManifestError(f"{where}: {key}: bad name {name[:80]!r}")
            text = _text(value, f"{where}: {key}.{name}")
            _check_item(cls, text, f"{where}: {key}.{name}")
            fields[f"{cls}:{name}"] = text
    meta = {k: _text(doc.get(k, ""), f"{where}: {k}") for k in META}
    if meta["python_path"] and not _PATH.fullmatch(meta["python_path"]):
        raise ManifestError(f"{where}: python_path must be an absolute path")
    return Manifest(fields, **meta)


def bad_item_name(name: str) -> bool:
    """Not a name a manifest lists a library, package or image under."""
    return _NAME.fullmatch(name) is None


def bad_python_path(path: str) -> bool:
    return _PATH.fullmatch(path) is None


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ManifestError(f"{where}: must be text, not {type(value).__name__}")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise ManifestError(f"{where}: must be printable text of at most {MAX_TEXT} characters")
    return value


def _check_item(cls: str, text: str, where: str) -> None:
    if cls == "image" and text and not is_digest(text):
        raise ManifestError(f"{where}: must be a digest such as sha256:<64 hex digits>")
    if cls == "library" and text:
        file, _, digest = text.partition(" ")
        if not _NAME.fullmatch(file) or (digest and not _HEX64.fullmatch(digest)):
            raise ManifestError(f"{where}: must be '<file> <sha256 hex>'")
