"""``slurm-burst runtime``: capture a node's or an image's runtime manifest, and compare
two (docs/runtime.md)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from slurm_burst.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, app, emit, fail, json_option
from slurm_burst.core.runtime import (
    LIVE_ONLY,
    RULE_NAMES,
    Difference,
    Manifest,
    ManifestError,
    bad_item_name,
    bad_python_path,
    compare,
    from_document,
    mismatches,
    to_document,
)


@click.group("runtime")
def group() -> None:
    """The runtime manifest: what a node runs (OS, kernel, glibc, GPU driver and CUDA,
    NCCL, MPI, listed libraries and Python packages), captured on-prem and enforced
    on every burst node before it joins (node_groups.*.runtime_manifest)."""


@group.command("capture")
@click.option(
    "--root", default="/", show_default=True, help="An unpacked image instead of this host."
)
@click.option(
    "--python",
    default="/usr/bin/python3",
    show_default=True,
    help="The jobs' interpreter: its version and the listed packages' versions.",
)
@click.option("--library", "libraries", multiple=True, help="A soname or path to record (digest).")
@click.option("--package", "packages", multiple=True, help="A Python distribution to record.")
@click.option(
    "--image", "images", multiple=True, help="A podman image (REF:TAG) whose digest to record."
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    show_default=True,
    help="Where to write the manifest ('-': standard output).",
)
def capture_cmd(
    root: str,
    python: str,
    libraries: tuple[str, ...],
    packages: tuple[str, ...],
    images: tuple[str, ...],
    out: str,
) -> None:
    """Capture this host's runtime manifest (on an on-prem reference node), or an
    image's (--root: its files; no kernel, driver or CUDA driver). A node group's
    runtime_manifest is such a file: its nodes capture the same fields and items."""
    if bad_python_path(python):
        fail(
            f"--python {python!r}: must be an absolute path (letters, digits, ._+-/)",
            EXIT_BAD_INPUT,
        )
    for opt, names in (("--library", libraries), ("--package", packages), ("--image", images)):
        for name in names:
            if bad_item_name(name):
                fail(f"{opt} {name[:80]!r}: not a name (letters, digits, ._+@:/-)", EXIT_BAD_INPUT)
    manifest = _captured(root, python, list(libraries), list(packages), list(images))
    text = json.dumps(to_document(manifest), indent=2, sort_keys=True) + "\n"
    if out == "-":
        click.echo(text, nl=False)
        return
    from slurm_burst.fileio import FileRefused, write_atomic

    try:
        with write_atomic(out, 0o644) as fh:
            fh.write(text)
    except (FileRefused, OSError, ValueError) as exc:
        fail(f"cannot write {out}: {getattr(exc, 'strerror', None) or exc}", EXIT_BAD_INPUT)
    click.echo(
        f"runtime manifest of {manifest.source}: {len(manifest.fields)} fields -> {out}", err=True
    )


@group.command("diff")
@click.argument("reference")
@click.argument("other")
@click.option(
    "--rule",
    type=click.Choice(RULE_NAMES),
    default=None,
    help="exact or compatible (default: a group's own rule where one is named, else compatible).",
)
@click.option("--all", "show_all", is_flag=True, help="List equal fields too.")
@json_option
@click.pass_context
def diff_cmd(
    ctx: click.Context, reference: str, other: str, rule: str | None, show_all: bool, as_json: bool
) -> None:
    """Compare OTHER with REFERENCE.

    Each is FILE (a captured manifest), 'here' (this host, captured now), 'image:DIR'
    (an unpacked image, captured now, with REFERENCE's libraries and packages),
    'group:NAME' (the group's runtime_manifest, and its rule) or 'node:NAME' (what the
    node said at its last join). Exit 0: nothing differs beyond the rule; 1: something
    does (the node would be refused with RuntimeMismatch); 2: a source that does not
    read."""
    ref, ref_rule = _source(ctx, reference, None)
    got, _ = _source(ctx, other, ref)
    rule = rule or ref_rule or "compatible"
    diffs = compare(ref, got, rule)
    bad = mismatches(diffs)
    rows = list(diffs)
    if show_all:
        differ = {d.field for d in diffs}
        rows += [
            Difference(name, value, value, True, "equal")
            for name, value in ref.fields.items()
            if name not in differ
        ]
    if as_json:
        emit(
            {
                "reference": reference,
                "other": other,
                "rule": rule,
                "mismatches": len(bad),
                "differences": [_row(d) for d in rows],
            },
            True,
        )
    elif rows:
        emit(
            rows,
            False,
            columns=("FIELD", reference, other, "VERDICT", "RULE"),
            rows=lambda ds: [
                (d.field, d.reference or "-", d.found or "-", _verdict(d), d.why) for d in ds
            ],
            title=f"runtime: {other} against {reference} ({rule})",
        )
    else:
        click.echo(f"{other} has {reference}'s runtime: {len(ref.fields)} fields equal")
    if bad:
        if not as_json:
            click.echo(f"{len(bad)} field(s) differ beyond '{rule}'", err=True)
        sys.exit(EXIT_FAILED)


def _row(d: Difference) -> dict[str, Any]:
    return {"field": d.field, "reference": d.reference, "other": d.found, "ok": d.ok, "rule": d.why}


def _verdict(d: Difference) -> str:
    if d.why == "equal":
        return "equal"
    if d.ok and not d.found and d.field in LIVE_ONLY:
        return "not compared"
    return "within rule" if d.ok else "MISMATCH"


def _captured(
    root: str, python: str, libraries: list[str], packages: list[str], images: Sequence[str] = ()
) -> Manifest:
    from slurm_burst.node import runtime as node_runtime

    if not os.path.isdir(root):
        fail(f"--root {root}: not a directory", EXIT_BAD_INPUT)
    doc = node_runtime.capture(
        node_runtime.Root(root),
        python,
        sorted(set(libraries)),
        sorted(set(packages)),
        None,
        sorted(set(images)),
    )
    try:
        return from_document(doc, f"the capture of {root}")
    except ManifestError as exc:
        fail(str(exc), EXIT_FAILED)


def _items(like: Manifest | None) -> tuple[str, list[str], list[str], list[str]]:
    """(interpreter, libraries, packages, images) to capture as ``like`` did."""
    if like is None:
        return "/usr/bin/python3", [], [], []
    names = [n.split(":", 1) for n in like.fields if ":" in n]
    return (
        like.python_path or "/usr/bin/python3",
        [n for cls, n in names if cls == "library"],
        [n for cls, n in names if cls == "package"],
        [n for cls, n in names if cls == "image"],
    )


def _source(ctx: click.Context, spec: str, like: Manifest | None) -> tuple[Manifest, str | None]:
    """(the manifest ``spec`` names, the rule it comes with: a group's); one captured now
    takes ``like``'s libraries, packages and interpreter."""
    from slurm_burst.runtimeref import node_manifest_path, read_manifest

    kind, sep, rest = spec.partition(":")
    try:
        if spec == "here" or (sep and kind == "image"):
            items = _items(like)
            return _captured("/" if spec == "here" else rest, *items), None
        if sep and kind == "group":
            cfg = app(ctx).config
            g = cfg.node_groups.get(rest)
            if g is None:
                fail(f"{spec}: no node group {rest!r} in {cfg.source}", EXIT_BAD_INPUT)
            if not g.runtime_manifest:
                fail(f"{spec}: the group names no runtime_manifest", EXIT_BAD_INPUT)
            return read_manifest(g.runtime_manifest)[0], g.runtime_rule
        if sep and kind == "node":
            path = node_manifest_path(app(ctx).config.daemon.state_dir, rest)
            if not path.exists():
                fail(f"{spec}: no runtime manifest kept for {rest} (its group checks none, "
                     "or it has not joined since)", EXIT_BAD_INPUT)  # fmt: skip
            return read_manifest(path, trusted=False)[0], None
        return read_manifest(spec, trusted=False)[0], None
    except ManifestError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
