"""The lab's simulated NVML: build ``libnvidia-ml.so.1`` from ``simnvml.c``, and write
the state file it reads (a VM's GPUs: model, driver, utilization, ECC, XIDs...).

The library is compiled with the system's C compiler (gcc from Debian) the first time
it is needed and again only when its source changes. The state is plain text, one
``key value`` per line (``simnvml.c`` lists the keys); :func:`render` makes it from a
dict, :data:`FAULTS` names the faults the lab's tests inject.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from slurm_burst_lab.cbuild import BuildError, build_shared

__all__ = ["FAULTS", "HEALTHY", "BuildError", "build", "render", "render_kmsg", "source"]

LIBRARY = "libnvidia-ml.so.1"
STATE_PATH = "/run/simgpu/nvml.state"  # where a GPU VM's library reads its GPUs
KMSG_PATH = "/run/simgpu/kmsg"  # a GPU VM's kernel log, as the GPU check reads it (gpu.kernel_log)

# The lab's healthy GPU: what the lab config's GPU group pins (model, driver, CUDA).
HEALTHY: dict[str, str | int] = {
    "name": "NVIDIA A100-SXM4-80GB",
    "driver": "550.54.15",
    "cuda": 12040,
    "arch": "ampere",
}

# Faults a VM can be born with (FaultyDriver's "gpu" rule): name -> state changes.
FAULTS: dict[str, dict[str, str | int]] = {
    "xid-79": {"gpu1.xid": 79},  # the GPU fell off the bus
    "ecc-uncorrectable": {"gpu0.ecc_uncorrected": 3},
    "row-remap-pending": {"gpu1.remap_pending": 1},
    "gpu-missing": {"count": 1},  # two promised, one seen
    "wrong-driver": {"driver": "535.104.05", "cuda": 12020},
}


def source() -> bytes:
    return resources.files(__name__).joinpath("simnvml.c").read_bytes()


def build(dest_dir: Path, cc: str = "gcc") -> Path:
    """``dest_dir/libnvidia-ml.so.1``, compiled unless it is already built from this
    source (``cbuild.build_shared``)."""
    return build_shared(source(), LIBRARY, dest_dir, cc=cc)


def render(count: int, changes: Mapping[str, str | int] | None = None) -> str:
    """The state file of a VM with ``count`` healthy GPUs, then ``changes`` applied."""
    state: dict[str, str | int] = {"count": count, **HEALTHY, **dict(changes or {})}
    for key, value in state.items():
        text = str(value)
        if not key or any(c.isspace() for c in key) or "\n" in text or "#" in text:
            raise ValueError(f"simulated NVML state: bad entry {key!r} = {text!r}")
    return "".join(f"{k} {v}\n" for k, v in state.items())


def ensure_node_python(python: Path) -> Path:
    """``python`` (``DIR/bin/python3``): the GPU nodes' Python with nvidia-ml-py, as the
    node_image role gives an image. The lab's VMs boot from images of other Debian
    suites too (Python 3.11, 3.13, 3.14), so instead of a virtual environment (tied to
    one Python) it is a wrapper running the VM's own ``python3`` with ``DIR/lib`` on
    its path, holding nvidia-ml-py (pure Python: the distribution this environment has,
    copied; the lab needs no package index)."""
    from importlib import metadata

    dist = metadata.distribution("nvidia-ml-py")
    root = python.parent.parent
    stamp = root / "nvidia-ml-py.version"
    want = f"{dist.version} wrapper"
    if python.exists() and stamp.exists():
        if stamp.read_text().strip() == want:
            return python
        shutil.rmtree(root)  # ours (the stamp says so), of an older layout: made again
    lib = root / "lib"
    for f in dist.files or ():
        src = Path(str(dist.locate_file(f)))
        if f.parts[0] == ".." or not src.is_file() or "__pycache__" in f.parts:
            continue
        dest = lib / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    python.parent.mkdir(parents=True, exist_ok=True)
    tmp = python.with_name(python.name + ".tmp")
    tmp.write_text(
        "#!/bin/sh\n# the lab's GPU nodes' Python: the VM's own, with nvidia-ml-py on its path\n"
        f'PYTHONPATH={lib}${{PYTHONPATH:+:$PYTHONPATH}} exec /usr/bin/python3 "$@"\n'
    )
    os.chmod(tmp, 0o755)  # noqa: S103  # a program every VM runs
    os.replace(tmp, python)
    stamp.write_text(want + "\n")
    return python


def render_kmsg(changes: Mapping[str, str | int] | None = None) -> str:
    """The kernel log of a VM whose GPUs have ``changes``: the driver's NVRM Xid line for
    each ``gpuN.xid`` (the VMs share the host's kernel, so the lab keeps their GPU
    drivers' kernel messages in a file of their own)."""
    lines = ["[    4.210000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  (simulated)"]
    for key, value in sorted((changes or {}).items()):
        gpu, _, name = key.partition(".")
        if name == "xid" and gpu.startswith("gpu") and gpu[3:].isdigit():
            bus = 0x10 + int(gpu[3:])
            lines.append(
                f"[  301.{bus:06d}] NVRM: Xid (PCI:0000:{bus:02x}:00): {int(value)}, pid=0, "
                "simulated"
            )
    return "\n".join(lines) + "\n"


def vm_files(gpus: int, changes: Mapping[str, str | int] | None = None) -> dict[str, str]:
    """What a GPU VM holds of its simulated GPUs: NVML's state and its kernel log."""
    return {STATE_PATH: render(gpus, changes), KMSG_PATH: render_kmsg(changes)}
