"""Build a small shared library of the lab's from its C source with the system's C
compiler (gcc from Debian), the first time it is needed and again only when its source
changes: the simulated NVML (``simnvml``) and slurmctld's pre_run poll (``prerunpoll``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class BuildError(RuntimeError):
    """The C compiler is missing or refused the source."""


def build_shared(
    src: bytes, name: str, dest_dir: Path, extra: tuple[str, ...] = (), cc: str = "gcc"
) -> Path:
    """``dest_dir/name`` compiled from ``src``, unless it is already built from this
    source (a stamp beside it holds the source's sha256). Atomic: a reader never sees
    a half-written library."""
    digest = hashlib.sha256(src).hexdigest()
    lib, stamp = dest_dir / name, dest_dir / f"{name}.sha256"
    if lib.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return lib
    if shutil.which(cc) is None:
        raise BuildError(f"{cc} not found: the lab builds {name} with it (apt install gcc)")
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        c_file = Path(tmp) / "source.c"
        c_file.write_bytes(src)
        out = Path(tmp) / name
        argv = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-Wl,-soname," + name]
        r = subprocess.run(
            [*argv, "-o", str(out), str(c_file), *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise BuildError(f"{cc} failed on the source of {name}:\n{r.stderr.strip()}")
        os.chmod(out, 0o755)  # noqa: S103  # a shared library anyone may load
        os.replace(out, lib)
    stamp.write_text(digest + "\n")
    return lib
