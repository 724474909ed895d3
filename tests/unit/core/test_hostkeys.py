"""Host keys read from a provider's console or API: what is pinned, what is refused."""

from __future__ import annotations

import pytest

from slurm_burst.core.hostkeys import (
    SERIAL_PORT_SCRIPT,
    key_entry,
    parse_console_host_keys,
)

ED = "AAAAC3NzaC1lZDI1NTE5AAAAIHo+WKFJQ7ZLEp2tdXsnFD9NJREzCNhZZwSlJ2rZJzg6"
EC = (
    "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBDpJH9Io1p931v68P8+DU8wgfZxz"
    "QAiqjD1OsxJCX4I7Z4vIbm7ib3Jfe90QajOoLg9MywXzwktuyI0zYVsvlFQ="
)
OLD = ED[:-8] + "AAAAAAA="  # another blob of the same type (not a real key: shape only)


def block(*lines: str, prefix: str = "") -> str:
    body = [f"{prefix}-----BEGIN SSH HOST KEY KEYS-----", *(prefix + x for x in lines)]
    return "\n".join([*body, f"{prefix}-----END SSH HOST KEY KEYS-----"]) + "\n"


@pytest.mark.parametrize(
    ("console", "keys"),
    [
        (block(f"ssh-ed25519 {ED} root@node"), [("ssh-ed25519", ED)]),
        (block(f"ssh-ed25519 {ED}", prefix="ec2: "), [("ssh-ed25519", ED)]),
        (
            block(
                f"ecdsa-sha2-nistp256 {EC} root@n",
                f"ssh-ed25519 {ED} root@n",
                prefix="Nov 23 11:00:01 n google_metadata_script_runner[712]: startup-script: ",
            ),
            [("ecdsa-sha2-nistp256", EC), ("ssh-ed25519", ED)],
        ),
        # the last complete block wins; an unfinished one after it does not count
        (
            block(f"ssh-ed25519 {OLD}") + block(f"ssh-ed25519 {ED}") + "-----BEGIN SSH HOST "
            "KEY KEYS-----\nssh-ed25519 " + EC + "\n",
            [("ssh-ed25519", ED)],
        ),
        (block(f"bogus-type {ED}", f"ssh-ed25519 {ED}"), [("ssh-ed25519", ED)]),
        (block(f"ssh-ed25519 {EC}"), []),  # a blob of another type
        (block("ssh-ed25519 AAAA!!notbase64"), []),
        (block("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5"), []),  # the type and no key
        ("no block here", []),
        ("-----END SSH HOST KEY KEYS-----\nssh-ed25519 " + ED, []),
    ],
    ids=[
        "plain",
        "ec2-prefix",
        "syslog-prefix",
        "last-block",
        "unknown-type",
        "type-mismatch",
        "not-base64",
        "truncated",
        "none",
        "end-first",
    ],
)
def test_console_host_keys(console: str, keys: list[tuple[str, str]]) -> None:
    assert parse_console_host_keys(console) == keys


def test_a_key_entry_is_checked_against_its_own_type_name() -> None:
    assert key_entry("ssh-ed25519", ED) == ("ssh-ed25519", ED)
    assert key_entry("ssh-ed25519", EC) is None
    assert key_entry("ssh-dss", ED) is None
    assert key_entry("ssh-ed25519", "") is None


def test_the_serial_port_script_prints_what_the_parser_reads() -> None:
    assert "BEGIN SSH HOST KEY KEYS" in SERIAL_PORT_SCRIPT and "/dev/ttyS0" in SERIAL_PORT_SCRIPT
    assert "_key.pub" in SERIAL_PORT_SCRIPT and "_key " not in SERIAL_PORT_SCRIPT  # public only
