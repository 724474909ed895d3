"""``python -m slurm_burst``: the same as the ``slurm-burst`` command."""

from slurm_burst.cli.main import main

main()
