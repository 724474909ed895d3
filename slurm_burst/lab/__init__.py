"""The local lab: real slurmctld/slurmd and a namespace cloud on one machine."""
