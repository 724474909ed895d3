"""The local lab: real slurmctld/slurmd and a namespace cloud on one machine."""

__version__ = "0.1.0"
