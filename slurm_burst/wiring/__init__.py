"""The composition root: the one place adapters are built from the configuration and
handed to the services. Services know ports only (``slurm_burst.ports``); these modules
name the adapters. Split by what they wire, so that each caller pays only for its own:

- ``light``: what the hooks and the quick commands build (the state database, the
  request spool, Slurm's commands, the clock, protected mode, the HA election);
- ``clouds``: the providers' drivers, the managed clouds and their API budgets;
- ``storage``: object and mesh stores, the stager, transfer and storage costs;
- ``ledger``: the SQL ledger, its spool, chargeback, Slurm accounting;
- ``daemon``: each service's settings and the daemon assembled from its parts.

This package's own module imports nothing: ``from slurm_burst.wiring.light import
node_store`` costs a hook only ``light``'s imports.
"""
