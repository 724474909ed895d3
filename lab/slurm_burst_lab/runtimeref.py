"""The lab's reference runtime: what a site does with ``slurm-burst runtime capture`` on
an on-prem node, done by ``lab up`` on the first on-prem node once it is up. The
capture program (``slurm_burst/node/runtime.py``, as the daemon copies it to burst
nodes) is fed to that VM's ``python3`` on its standard input, so it runs on whichever
release's image the node booted, with that image's libraries and packages."""

from __future__ import annotations

import json
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from slurm_burst.core.jsonread import read_json
from slurm_burst.core.runtime import from_document
from slurm_burst.fileio import write_durable
from slurm_burst_lab.config import LabConfig
from slurm_burst_lab.nscloud import vm

TIMEOUT = 60


def run_node_program(
    node: dict[str, Any], program: str, *args: str, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    """``slurm_burst/node/<program>`` run in the VM ``node`` (its record in the lab's:
    ``launcher_pid``) by the VM's own ``python3``, fed on its standard input: the VM's
    root may be another release's image, without slurm-burst in it."""
    code = resources.files("slurm_burst.node").joinpath(program).read_bytes()
    argv = [*vm.enter_argv(int(node["launcher_pid"])), "python3", "-", *args]
    return subprocess.run(argv, input=code, capture_output=True, timeout=timeout, check=False)


def capture_reference(lab: LabConfig, onprem: dict[str, dict[str, Any]]) -> Path | None:
    """``lab.runtime_reference`` captured on the first on-prem node (None: not asked)."""
    if not lab.runtime_reference or not onprem:
        return None
    args = ["capture"]
    for name in lab.runtime_packages:
        args += ["--package", name]
    for name in lab.runtime_libraries:
        args += ["--library", name]
    done = run_node_program(onprem[sorted(onprem)[0]], "runtime.py", *args)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        raise RuntimeError(f"runtime capture on the on-prem node failed: {said}")
    doc = read_json(done.stdout, "the on-prem node's runtime manifest")
    from_document(doc, "the on-prem node's runtime manifest")  # what the daemon will read
    path = Path(lab.runtime_reference)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    body = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    write_durable(path.parent, path.name, body, 0o644)
    return path
