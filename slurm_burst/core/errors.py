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

# The command line's exit codes (cli/common.py documents them; errors carry theirs).
EXIT_FAILED = 1  # a step failed at run time
EXIT_BAD_INPUT = 2  # bad input: usage, configuration, a malformed value; nothing changed
EXIT_PRECONDITION = 3  # cannot run here: not root, a missing program, a service down


class BurstError(RuntimeError):
    """The one base of every error a user or an operator can see.

    ``code``: stable, a word (docs/operations.md explains each); the daemon puts it in a
    node's Slurm reason, ``(Code:...)``, and in its events. ``str(error)``: the message
    for a person, saying what is wrong and where. ``exit_code``: what the command line
    exits with when it ends a command (cli/main.py maps them, in one place).
    Subclasses set their defaults; an instance may carry a more precise code.
    """

    code = "InternalError"
    exit_code = EXIT_FAILED

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


class BadInput(BurstError):
    """Input that cannot be used (a value, a file, a flag); nothing was changed."""

    code = "BadInput"
    exit_code = EXIT_BAD_INPUT


class StepError(BurstError):
    """A provisioning step failed; ``code`` names the step or the cause."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code)


class DaemonError(BurstError):
    """The daemon cannot start here: another holds the host's lock, or its state
    directory is not one it may use."""

    code = "DaemonStart"
    exit_code = EXIT_PRECONDITION
