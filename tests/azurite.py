"""A real Azure Blob Storage emulator for the staging tests: Azurite (npm's ``azurite``,
Microsoft's own), its blob service alone, in memory, on a free loopback port. It checks
every request's Shared Key signature and every SAS token against the account key, as
Azure does: a wrong key, an altered or expired SAS is refused."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.s3server import free_port, wait_listening

# Azurite's well-known development account (public, in Azure's own documentation)
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def azurite() -> str | None:
    return shutil.which("azurite-blob")


@dataclass
class Azurite:
    port: int
    container: str = "stage"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def azurite_server(root: Path, container: str = "stage") -> Iterator[Azurite]:
    from libcloud.storage.drivers.azure_blobs import AzureBlobsStorageDriver

    binary = azurite()
    if binary is None:
        raise RuntimeError("Azurite is not installed: npm install -g azurite (make test does)")
    port = free_port()
    cmd = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
           "--silent", "--skipApiVersionCheck", "--disableProductStyleUrl"]  # fmt: skip
    log = open(root / "azurite.log", "ab")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=root)
    try:
        wait_listening(proc, port, root / "azurite.log", "Azurite", 30)
        driver = AzureBlobsStorageDriver(
            ACCOUNT, ACCOUNT_KEY, host="127.0.0.1", port=port, secure=False
        )  # type: ignore[no-untyped-call]
        driver.create_container(container)  # type: ignore[no-untyped-call]
        yield Azurite(port, container)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
