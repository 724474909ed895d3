"""SSH host keys as a cloud reports them: the trust anchor of our bootstrap.

cloud-init prints the host's public keys to the instance console between
``-----BEGIN SSH HOST KEY KEYS-----`` and ``-----END SSH HOST KEY KEYS-----``.
The console is read through the provider's authenticated API (EC2
GetConsoleOutput, GCE serial port, Azure boot diagnostics, OpenStack console
log), so a key found there was written by the instance itself: we pin it and
reject any other key the SSH server offers. Pure: parsing only.
"""

from __future__ import annotations

BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
END = "-----END SSH HOST KEY KEYS-----"
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)


def parse_console_host_keys(console: str) -> list[tuple[str, str]]:
    """(key type, base64 key) pairs from the last complete key block of ``console``."""
    block: list[str] | None = None
    found: list[str] = []
    for line in console.splitlines():
        text = line.strip()
        # cloud-init prefixes console lines with "ec2: " on some images
        text = text.removeprefix("ec2: ").strip()
        if text == BEGIN:
            block = []
        elif text == END and block is not None:
            found = block
            block = None
        elif block is not None and text:
            block.append(text)
    keys = []
    for entry in found:
        parts = entry.split()
        if len(parts) >= 2 and parts[0] in KEY_TYPES:
            keys.append((parts[0], parts[1]))
    return keys
