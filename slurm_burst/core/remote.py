"""Errors of a remote session on a node, in our own terms (the SSH adapter raises them)."""

from __future__ import annotations

from slurm_burst.core.errors import BurstError

# What ``RemoteError.code`` may be; each ends up in the node's Slurm reason.
REMOTE_CODES = frozenset(
    {
        "SshUnreachable",  # nothing answered before the deadline
        "HostKeyUnknown",  # the provider attested no host key: nothing to trust
        "HostKeyMismatch",  # the node's key is not the attested one
        "AuthFailed",  # the node refused the daemon's key
        "RemoteCommand",  # a command ran and failed (non-zero exit, failed file transfer)
    }
)


class RemoteError(BurstError):
    """A remote session failed; ``code`` says how (one of :data:`REMOTE_CODES`)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code)
