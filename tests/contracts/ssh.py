"""The Connector and RemoteShell contract."""

from __future__ import annotations

import pytest

from slurm_burst.core.remote import RemoteError
from slurm_burst.ports import Clock, Connector


class ShellContract:
    """Subclasses provide ``connector``, ``clock`` (the clock the connector's deadlines
    are on), ``node`` (host, attested host keys) of a node with sshd up, and
    ``nowhere``: an address where nothing answers."""

    def test_commands_run_with_their_arguments_as_data(
        self, connector: Connector, clock: Clock, node: tuple[str, list[tuple[str, str]]]
    ) -> None:
        host, keys = node
        sh = connector.connect(host, keys, clock.monotonic() + 30)
        try:
            assert sh.run(["true"]) == ""
            assert sh.run(["echo", "a  b", "$(id)", "'q'"]) == "a  b $(id) 'q'\n"
            with pytest.raises(RemoteError) as err:
                sh.run(["false"])
            assert err.value.code == "RemoteCommand"
        finally:
            sh.close()

    def test_put_writes_the_file_with_its_mode(
        self, connector: Connector, clock: Clock, node: tuple[str, list[tuple[str, str]]]
    ) -> None:
        host, keys = node
        sh = connector.connect(host, keys, clock.monotonic() + 30)
        try:
            sh.put(b"secret\n", "/tmp/contract-put", 0o600)
            assert sh.run(["cat", "/tmp/contract-put"]) == "secret\n"
            assert sh.run(["stat", "-c", "%a", "/tmp/contract-put"]) == "600\n"
            sh.put(b"again\n", "/tmp/contract-put", 0o400)  # replaced
            assert sh.run(["stat", "-c", "%a", "/tmp/contract-put"]) == "400\n"
        finally:
            sh.close()

    def test_only_the_attested_host_key_is_trusted(
        self, connector: Connector, clock: Clock, node: tuple[str, list[tuple[str, str]]]
    ) -> None:
        host = node[0]
        other = [
            ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIOBYh6nHeGo5Il+cuDWqs+VDL5Ef4l4ZtYRXrTrq1v3k")
        ]
        with pytest.raises(RemoteError) as err:
            connector.connect(host, other, clock.monotonic() + 10)
        assert err.value.code == "HostKeyMismatch"
        with pytest.raises(RemoteError) as err:
            connector.connect(host, [], clock.monotonic() + 10)
        assert err.value.code == "HostKeyUnknown"

    def test_nothing_answering_is_unreachable_at_the_deadline(
        self, connector: Connector, clock: Clock, nowhere: str,
        node: tuple[str, list[tuple[str, str]]],
    ) -> None:  # fmt: skip
        started = clock.monotonic()
        with pytest.raises(RemoteError) as err:
            connector.connect(nowhere, node[1], started + 2)
        assert err.value.code == "SshUnreachable"
        assert clock.monotonic() >= started + 2
