"""Slurm adapters: the CLI backend (sinfo/squeue/scontrol); pyslurm may slot in later."""
