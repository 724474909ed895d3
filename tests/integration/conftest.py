"""This tier's shared fixtures: the providers' recorded HTTP answers, the EC2 and GCE
emulators."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.azuretools import azure_emu  # noqa: F401  (a fixture: the Azure emulator)
from tests.integration.ec2config import cfg_factory  # noqa: F401  (a fixture)
from tests.integration.gcetools import driver, emu  # noqa: F401  (fixtures: the GCE emulator)
from tests.providers import azure, gce, http, openstack  # noqa: F401  (fixtures)
from tests.s3server import S3Server, s3_server


@pytest.fixture(scope="module")
def emulator() -> Iterator[Any]:
    """The EC2 emulator on loopback, API only (moto is imported when it starts)."""
    pytest.importorskip(
        "moto", reason="the EC2 emulator needs moto[server] (make test installs it)"
    )
    from slurm_burst_lab.ec2emu import Ec2Emulator

    ec2 = Ec2Emulator()
    ec2.start()
    yield ec2
    ec2.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (rclone serve s3), one for each test module."""
    with s3_server(tmp_path_factory.mktemp("s3")) as s:
        yield s
