"""The one error contract of the daemon: every failure it can meet while it drives a node
is a :class:`BurstError` carrying a ``code``.

Cloud calls (``core.cloud.CloudError``), the remote session (``core.remote.RemoteError``),
the WireGuard hub (``core.mesh.MeshError``), Slurm (``core.slurm.SchedulerError``), the
state store (``core.records.StoreError``) and a failed step (:class:`StepError`) all derive
from it, so the provisioner decides by type what to do with a failure, and the code it
puts in the node's Slurm reason, ``(Code:...)``, is always the error's own. Every code is
explained in docs/operations.md (a test checks it).
"""

from __future__ import annotations


class BurstError(RuntimeError):
    """A failure with a code for the node's reason; subclasses set their default code."""

    code = "InternalError"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


class StepError(BurstError):
    """A provisioning step failed; ``code`` names the step or the cause."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code)
