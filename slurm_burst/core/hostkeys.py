"""SSH host keys as a cloud reports them: the trust anchor of our bootstrap.

A new instance's host keys are read through the provider's authenticated API, never
learned from the network: what the API returns was written by the instance itself, so
the daemon pins those keys and rejects any other key the SSH server offers. Where each
provider lets us read them (its module of :mod:`slurm_burst.adapters.cloud.providers`
names its sources):

- ``console``: the instance console. cloud-init prints the host's public keys between
  ``-----BEGIN SSH HOST KEY KEYS-----`` and ``-----END SSH HOST KEY KEYS-----``
  (EC2 GetConsoleOutput, OpenStack's console log).
- ``guest-attributes``: GCE's guest attributes, where Google's guest environment
  publishes the keys under ``hostkeys/`` (metadata ``enable-guest-attributes=TRUE``).
- ``serial-port``: GCE's serial port 1, where our startup script prints the same
  block as cloud-init does (Google's images have no cloud-init).
- ``boot-diagnostics``: Azure's boot diagnostics serial log (enabled at create).

Pure: tables and parsing only.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct

BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
END = "-----END SSH HOST KEY KEYS-----"
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")

# the startup-script lines that print the block to GCE's serial port 1 (public keys only):
# sshd's keys may be made by the guest environment a moment after the script starts
SERIAL_PORT_SCRIPT = (
    "# slurm-burst: the SSH host keys to serial port 1, for the daemon to read through the API\n"
    "for _ in $(seq 120); do ls /etc/ssh/ssh_host_*_key.pub >/dev/null 2>&1 && break; "
    "sleep 1; done\n"
    f"{{ echo '{BEGIN}'; cat /etc/ssh/ssh_host_*_key.pub; echo '{END}'; }} > /dev/ttyS0\n"
)


def key_entry(ktype: str, body: str) -> tuple[str, str] | None:
    """``(type, base64)`` if ``body`` is an SSH public key blob of ``ktype``, a type we
    pin (the blob starts with its own type name, RFC 4253 6.6), else None."""
    ktype, body = ktype.strip(), body.strip()
    if ktype not in KEY_TYPES or not _BASE64.match(body):
        return None
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(blob) < 4:
        return None
    (size,) = struct.unpack(">I", blob[:4])
    if blob[4 : 4 + size] != ktype.encode() or len(blob) <= 4 + size:
        return None
    return ktype, body


def parse_console_host_keys(console: str) -> list[tuple[str, str]]:
    """(key type, base64 key) pairs from the last complete key block of ``console``.

    Console lines may carry a prefix (``ec2: ``, a syslog stamp, a guest agent's
    name); the markers and keys are found wherever they start on their line.
    """
    block: list[str] | None = None
    found: list[str] = []
    for line in console.splitlines():
        if BEGIN in line:
            block = []
        elif END in line and block is not None:
            found = block
            block = None
        elif block is not None and line.strip():
            block.append(line)
    keys = []
    for entry in found:
        words = entry.split()
        for i, word in enumerate(words[:-1]):
            key = key_entry(word, words[i + 1])
            if key is not None:
                keys.append(key)
                break
    return keys
