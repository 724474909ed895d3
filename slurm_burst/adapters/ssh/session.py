"""SSH to cloud nodes with paramiko, trusting only the host key the provider attested.

Trust model (works on real clouds as in the lab): the instance prints its SSH
host keys on its console (cloud-init does this on every major image); the
daemon reads the console through the provider's authenticated API and pins
those keys for the instance's address. paramiko's ``RejectPolicy`` then refuses
any server that cannot prove it holds one of them, so a machine that took over
the address, or a man in the middle, gets nothing (not the munge key). No host
key is ever learned from the network itself (no ``AutoAddPolicy``), and no
``known_hosts`` file is shared between instances that reuse an address.

Remote commands are argument lists joined with ``shlex.join``: node names and
paths are data to the remote shell, never code.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path

import paramiko

from slurm_burst.adapters.proc import run
from slurm_burst.core.remote import RemoteError
from slurm_burst.fileio import ensure_dir, plain

log = logging.getLogger(__name__)


MAX_SAID = 256 * 1024 * 1024  # a node's answer (an output scan of a million files: ~100 MB)
MAX_SAID_ERR = 1024 * 1024


class SshError(RemoteError):
    """SSH failed: ``code`` is SshUnreachable, HostKeyMismatch, AuthFailed or RemoteCommand."""


class SshSession:
    def __init__(self, client: paramiko.SSHClient, host: str) -> None:
        self.client = client
        self.host = host

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        """Run ``argv`` on the node; return stdout; raise SshError on a non-zero exit, or
        when the node says more than :data:`MAX_SAID` bytes (a node is less trusted than
        the controller: what it says is read bounded)."""
        command = shlex.join(argv)
        started = time.monotonic()
        try:
            _stdin, stdout, stderr = self.client.exec_command(command, timeout=timeout)
            said = stdout.read(MAX_SAID + 1)
            if len(said) > MAX_SAID:
                raise SshError(f"{self.host}: {argv[0]}: said more than {MAX_SAID:,} bytes",
                               "RemoteCommand")  # fmt: skip
            out = said.decode(errors="replace")
            err = stderr.read(MAX_SAID_ERR).decode(errors="replace")
            status = stdout.channel.recv_exit_status()
        except (paramiko.SSHException, OSError) as exc:
            raise SshError(
                f"{self.host}: {argv[0]} {argv[1] if len(argv) > 1 else ''}: {exc}", "RemoteCommand"
            ) from exc
        log.debug(
            "ssh.run host=%s argv0=%s rc=%d seconds=%.2f",
            self.host,
            argv[0],
            status,
            time.monotonic() - started,
        )
        if status != 0:
            detail = (err or out).strip().splitlines()[-3:]
            raise SshError(
                f"{self.host}: {' '.join(argv[:3])} exited {status}: {' | '.join(detail)}",
                "RemoteCommand",
            )
        return out

    def put(self, data: bytes, path: str, mode: int, owner: tuple[int, int] | None = None) -> None:
        """Write ``data`` to ``path`` over SFTP, created with ``mode`` (and ``owner``) before
        any byte lands, then renamed into place."""
        tmp = f"{path}.slurm-burst.tmp"
        try:
            with self.client.open_sftp() as sftp:
                with contextlib.suppress(OSError):
                    sftp.remove(tmp)
                # open with mode 0600 first: no window in which the content is readable
                with sftp.open(tmp, "wb") as fh:
                    sftp.chmod(tmp, 0o600)
                    fh.write(data)
                if owner is not None:
                    sftp.chown(tmp, *owner)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
        except (paramiko.SSHException, OSError) as exc:
            raise SshError(f"{self.host}: sftp put {path}: {exc}", "RemoteCommand") from exc

    def close(self) -> None:
        self.client.close()


class SshConnector:
    """Opens sessions as ``user`` with the daemon's private key."""

    def __init__(self, user: str, key_path: str, connect_timeout: float = 10.0) -> None:
        self.user = user
        self.key_path = key_path
        self.connect_timeout = connect_timeout
        self._key: paramiko.PKey | None = None

    def _pkey(self) -> paramiko.PKey:
        if self._key is None:
            self._key = paramiko.PKey.from_path(self.key_path)
        return self._key

    def connect(
        self, host: str, host_keys: Sequence[tuple[str, str]], deadline: float
    ) -> SshSession:
        """Connect, retrying until ``deadline`` (time.monotonic) while sshd is not up yet."""
        if not host_keys:
            raise SshError(f"{host}: no attested host key to trust", "HostKeyUnknown")
        attempt, last = 0, ""
        while True:
            attempt += 1
            client = paramiko.SSHClient()
            for ktype, b64 in host_keys:
                key = paramiko.PKey.from_type_string(ktype, base64.b64decode(b64))
                client.get_host_keys().add(host, ktype, key)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            try:
                client.connect(
                    host,
                    username=self.user,
                    pkey=self._pkey(),
                    timeout=self.connect_timeout,
                    banner_timeout=self.connect_timeout,
                    auth_timeout=self.connect_timeout,
                    allow_agent=False,
                    look_for_keys=False,
                    disabled_algorithms={"keys": []},
                )
                log.info("ssh.connected host=%s attempts=%d", host, attempt)
                return SshSession(client, host)
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise SshError(
                    f"{host}: host key does not match the attested one", "HostKeyMismatch"
                ) from exc
            except paramiko.SSHException as exc:
                client.close()
                if "not found in known_hosts" in str(exc):
                    raise SshError(
                        f"{host}: server offered an unattested host key type", "HostKeyMismatch"
                    ) from exc
                if isinstance(exc, paramiko.AuthenticationException):
                    raise SshError(f"{host}: authentication failed", "AuthFailed") from exc
                last = str(exc)
            except (TimeoutError, OSError, EOFError) as exc:
                client.close()
                last = str(exc) or type(exc).__name__
            if time.monotonic() >= deadline:
                raise SshError(
                    f"{host}: ssh not reachable after {attempt} attempts: {last}", "SshUnreachable"
                )
            time.sleep(min(0.5 * attempt, 3.0))


def generate_key(path: str) -> str:
    """An ed25519 key pair for the daemon at ``path`` (0600); return the public key line.

    Generated here, where it lives; only the public half ever leaves this host.
    """
    priv = Path(path)
    pub = Path(path + ".pub")
    if not priv.exists():
        ensure_dir(priv.parent, 0o700, what="the daemon's key directory")
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "slurm-burst-daemon",
                "-f",
                str(priv),
            ]
        )
    plain(priv, os.lstat(priv))  # ours: a link planted at its name is refused, not followed
    priv.chmod(0o600)
    return pub.read_text().strip()
