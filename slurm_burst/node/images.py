"""slurm-burst's image load on a cloud node: an OCI image layout the daemon had pulled
here from the staging store (each file verified against the store's manifest) is
checked to be exactly the pinned image, then loaded into podman under the site's name.

    images.py load --dir DIR --ref REF --digest sha256:HEX

1. ``index.json`` lists one manifest, ``--digest``; every blob's SHA-256 is its name;
   the manifest's config and layers are all there. Anything else: refused, nothing
   loaded (a digest that does not match never runs).
2. ``podman pull oci:DIR:<tag>`` (the node's containers.conf and storage.conf apply),
   then tagged ``REF:<digest's first 16 hex>``, which podman also resolves as
   ``REF@DIGEST``; podman's own digest of the image must be ``--digest``.

Standard library only; every command an argument list with a timeout. One JSON object
on stdout: ``{"ok": true, "id": ..., "digest": ...}`` or ``{"ok": false, "problems":
[...]}``; exit 0 either way (the daemon judges), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from typing import Any

TIMEOUT = 600  # seconds podman may take to load a large image
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def verify(layout: str, digest: str) -> list[str]:
    """What is wrong with ``layout`` as the image ``digest`` (empty: nothing)."""
    try:
        with open(os.path.join(layout, "index.json"), "rb") as f:
            index = json.loads(f.read(4 << 20))
        listed = [m.get("digest") for m in index.get("manifests", []) if isinstance(m, dict)]
    except (OSError, ValueError, AttributeError) as exc:
        return [f"index.json: {exc}"]
    if listed != [digest]:
        return [f"index.json lists {listed[:3]}, not {digest} alone"]
    blobs = os.path.join(layout, "blobs", "sha256")
    problems = []
    try:
        names = sorted(os.listdir(blobs))
    except OSError as exc:
        return [f"blobs: {exc.strerror}"]
    for name in names:
        sha = hashlib.sha256()
        path = os.path.join(blobs, name)
        if os.path.islink(path) or not os.path.isfile(path):
            problems.append(f"blob {name}: not a regular file")
            continue
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
        if sha.hexdigest() != name:
            problems.append(f"blob {name[:16]}: its content is sha256:{sha.hexdigest()[:16]}...")
    hexd = digest.split(":", 1)[1]
    if hexd not in names:
        return [*problems, f"the manifest {digest} is not in the layout"]
    try:
        with open(os.path.join(blobs, hexd), "rb") as f:
            manifest = json.loads(f.read(4 << 20))
        needed = [manifest["config"]["digest"]] + [x["digest"] for x in manifest["layers"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [*problems, f"the manifest does not read: {exc}"]
    for d in needed:
        m = DIGEST.fullmatch(str(d))
        if m is None or m.group(1) not in names:
            problems.append(f"the manifest's blob {str(d)[:80]} is not in the layout")
    return problems


def _podman(*args: str) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=TIMEOUT,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"podman {args[0]}: {done.stderr.strip()[-300:]}")
    return done.stdout.strip()


def load(layout: str, ref: str, digest: str) -> dict[str, Any]:
    problems = verify(layout, digest)
    if problems:
        return {"ok": False, "problems": problems}
    hexd = digest.split(":", 1)[1]
    tag = f"{ref}:{hexd[:16]}"
    try:
        with open(os.path.join(layout, "index.json"), "rb") as f:
            index = json.loads(f.read(4 << 20))
        name = (
            index["manifests"][0]
            .get("annotations", {})
            .get("org.opencontainers.image.ref.name", "")
        )
        image_id = _podman("pull", "-q", f"oci:{layout}:{name}" if name else f"oci:{layout}")
        image_id = image_id.splitlines()[-1]
        _podman("tag", image_id, tag)
        names = _podman("image", "inspect", "--format", "{{json .RepoTags}}", tag)
        for other in json.loads(names or "[]"):  # the name podman made from the directory
            if isinstance(other, str) and not other.startswith(f"{ref}:"):
                _podman("untag", image_id, other)
        said = _podman("image", "inspect", "--format", "{{.Digest}}", tag)
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError, LookupError) as exc:
        return {"ok": False, "problems": [str(exc)[-400:]]}
    if said != digest:
        return {"ok": False, "problems": [f"podman says {tag} is {said}, not {digest}"]}
    return {"ok": True, "id": image_id, "digest": said, "tag": tag}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="images.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ld = sub.add_parser("load", help="verify an image layout and load it into podman")
    ld.add_argument("--dir", required=True)
    ld.add_argument("--ref", required=True)
    ld.add_argument("--digest", required=True)
    args = parser.parse_args(argv)
    if not DIGEST.fullmatch(args.digest) or not re.fullmatch(r"[a-z0-9][a-z0-9._/:-]{0,254}",
                                                              args.ref):  # fmt: skip
        print("images.py: bad --digest or --ref", file=sys.stderr)
        return 2
    print(json.dumps(load(args.dir, args.ref, args.digest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
