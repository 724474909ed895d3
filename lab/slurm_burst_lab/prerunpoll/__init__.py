"""slurmctld's burst_buffer/lua pre_run poll, shortened for the lab: ``prerunpoll.c``,
built into a library preloaded into the lab's slurmctld only (see its comment for what
it changes and why). ``[lab] pre_run_poll`` sets the seconds; 60 (Slurm's own) preloads
nothing."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from slurm_burst_lab.cbuild import build_shared

LIBRARY = "libsbl-prerunpoll.so"
SLURM_POLL = 60  # burst_buffer_lua.c's sleep(60)
VARIABLE = "SLURM_BURST_LAB_PRE_RUN_POLL"


def source() -> bytes:
    return resources.files(__name__).joinpath("prerunpoll.c").read_bytes()


def environment(seconds: int, dest_dir: Path) -> dict[str, str]:
    """What slurmctld's environment needs for a pre_run poll of ``seconds``: the library
    (built in ``dest_dir``, a directory another release's root sees at the same path)
    preloaded and the seconds; nothing for Slurm's own 60."""
    if seconds >= SLURM_POLL:
        return {}
    library = build_shared(source(), LIBRARY, dest_dir, extra=("-ldl",))
    return {"LD_PRELOAD": str(library), VARIABLE: str(seconds)}
