"""``python -m ...sethostname NAME -- PROGRAM ARGS``: set the hostname, then exec PROGRAM.

Run under ``unshare --uts`` so that slurmctld sees the controller name the lab's
slurm.conf gives it, without touching the host's own hostname.
"""

from __future__ import annotations

import os
import socket
import sys


def main(argv: list[str]) -> None:
    name, sep, *program = argv
    if sep != "--" or not program:
        raise SystemExit("usage: sethostname NAME -- PROGRAM [ARGS...]")
    socket.sethostname(name)
    os.execvp(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
