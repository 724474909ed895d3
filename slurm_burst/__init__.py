"""slurm-burst: cloud bursting for Slurm clusters."""

__version__ = "0.1.0"
