"""The same runtime on both sides (issue 54): what the runtime step and the image load
add to a node's join.

- ``runtime.py capture`` on this host, as a node runs it at its join (the lab's
  reference items: numpy, mpi4py, libmpi.so.40): wall time, alone and beside two CPU
  burners;
- ``compare`` of two manifests of 4,096 libraries and 4,096 packages each;
- an image of one layer of ``--layer-mib`` MiB: the daemon's verified copy out of the
  site's layout (``pinned_copy``) and the node's check of it (``images.py verify``),
  in MiB/s (each reads every byte once and hashes it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import burners  # noqa: E402
from sizes import size  # noqa: E402

from slurm_burst.adapters.imagelayout import pinned_copy  # noqa: E402
from slurm_burst.core.runtime import Manifest, compare  # noqa: E402
from slurm_burst.node import images as node_images  # noqa: E402

CAPTURE = ROOT / "slurm_burst" / "node" / "runtime.py"


def bench_capture(runs: int) -> None:
    argv = [sys.executable, str(CAPTURE), "capture", "--package", "numpy", "--package",
            "mpi4py", "--library", "libmpi.so.40"]  # fmt: skip
    for load in (0, 2):
        walls = []
        with burners(load):
            for _ in range(runs):
                t = time.perf_counter()
                subprocess.run(argv, capture_output=True, check=True, timeout=60)
                walls.append(time.perf_counter() - t)
        print(f"runtime capture on a node ({load} CPU burners)   best {min(walls):.3f} s  "
              f"median {statistics.median(walls):.3f} s")  # fmt: skip


def bench_compare(items: int) -> None:
    fields = {f"library:lib{i}.so.1": f"lib{i}.so.1.2.{i} " + "a" * 64 for i in range(items)}
    fields |= {f"package:p{i}": f"1.{i}.0" for i in range(items)}
    ref = Manifest(fields)
    node = Manifest({k: (v.replace("a" * 64, "b" * 64) if k.startswith("library") else v)
                     for k, v in fields.items()}, source="node")  # fmt: skip
    walls = []
    for _ in range(5):
        t = time.perf_counter()
        diffs = compare(ref, node, "compatible")
        walls.append(time.perf_counter() - t)
    assert len(diffs) == items
    print(f"compare {2 * items:,} fields ({items:,} differ within the rule)   "
          f"median {statistics.median(walls) * 1000:.1f} ms")  # fmt: skip


def _layout(root: Path, layer_mib: int) -> str:
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = os.urandom(1 << 20) * layer_mib
    lh = hashlib.sha256(layer).hexdigest()
    (blobs / lh).write_bytes(layer)
    config = json.dumps({"rootfs": {"diff_ids": [f"sha256:{lh}"]}}).encode()
    ch = hashlib.sha256(config).hexdigest()
    (blobs / ch).write_bytes(config)
    manifest = json.dumps({
        "schemaVersion": 2, "config": {"digest": f"sha256:{ch}", "size": len(config)},
        "layers": [{"digest": f"sha256:{lh}", "size": len(layer)}],
    }).encode()  # fmt: skip
    mh = hashlib.sha256(manifest).hexdigest()
    (blobs / mh).write_bytes(manifest)
    (root / "index.json").write_text(json.dumps({"manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": f"sha256:{mh}", "size": len(manifest)}]}))  # fmt: skip
    return f"sha256:{mh}"


def bench_image(layer_mib: int) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        site = Path(tmp, "site")
        digest = _layout(site, layer_mib)
        t = time.perf_counter()
        copy = pinned_copy(str(site), "localhost/bench", digest, str(Path(tmp, "work")))
        copied = time.perf_counter() - t
        t = time.perf_counter()
        problems = node_images.verify(str(copy), digest)
        verified = time.perf_counter() - t
        assert problems == [], problems
    print(f"image of {layer_mib} MiB: the daemon's verified copy {layer_mib / copied:.0f} MiB/s, "
          f"the node's check {layer_mib / verified:.0f} MiB/s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=size(7, 2))
    parser.add_argument("--items", type=int, default=size(4096, 256))
    parser.add_argument("--layer-mib", type=int, default=size(512, 16))
    args = parser.parse_args()
    bench_capture(args.runs)
    bench_compare(args.items)
    bench_image(args.layer_mib)


if __name__ == "__main__":
    main()
