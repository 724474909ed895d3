"""libcloud's ``dummy`` driver: no credentials, no host keys (``config check`` refuses it
for node groups; it serves libcloud's own examples)."""

from __future__ import annotations

from slurm_burst.adapters.cloud.providers import Provider


class Dummy(Provider):
    name = "dummy"
    needs_credentials = False


PROVIDER = Dummy()
