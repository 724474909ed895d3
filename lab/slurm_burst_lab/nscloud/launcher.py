"""The VM's host-side launcher: plumb the network, wait the boot delay, enter namespaces.

Run detached by :func:`vm.boot`; after the delay it *becomes* ``nsenter`` then
``unshare``, whose child is the VM's PID 1. The time namespace moves the VM's
boot time to now, as a freshly booted machine reports (Slurm requires a new
boot time from a resumed node).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from slurm_burst_lab.nscloud import net
from slurm_burst_lab.nscloud.vm import read_spec, write_json_atomic


def main(vmdir: Path) -> None:
    spec = read_spec(vmdir)
    write_json_atomic(vmdir / "status.json", {"state": "pending"})
    net.create_guest_network(spec.netns, spec.host_if, spec.bridge, spec.address, spec.gateway)
    time.sleep(spec.boot_delay)
    with open("/proc/uptime", encoding="ascii") as fh:
        uptime = int(float(fh.read().split()[0]))
    for cgroup in spec.cgroups:  # systemd's own: it manages what is below, as on a host
        os.makedirs(cgroup, exist_ok=True)
        with open(f"{cgroup}/cgroup.procs", "w", encoding="ascii") as fh:
            fh.write(str(os.getpid()))
    argv = [
        "nsenter",
        f"--net={net.NETNS_DIR / spec.netns}",
        "--",
        "unshare",
        "--mount",
        "--uts",
        "--pid",
        "--fork",
        "--time",
        *(["--cgroup"] if spec.cgroups else []),
        f"--boottime=-{uptime}",
        "--mount-proc",
        "--propagation",
        "private",
        "--",
        sys.executable,
        "-m",
        "slurm_burst_lab.nscloud.vminit",
        str(vmdir),
    ]
    print(f"launcher: booting {spec.id} ({spec.hostname}) at {spec.address}", flush=True)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
