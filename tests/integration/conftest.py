"""This tier's shared fixtures: the providers' recorded HTTP answers, the EC2 and GCE
emulators."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class NodeApiStub(ThreadingHTTPServer):
    """The daemon's node API as a node's agent sees it (its notices, kept): the agent's
    side is what these tests read; the daemon's own is tested with its real API
    (test_node_api_http) and end to end in the lab. ``answer``: what it says back."""

    def __init__(self) -> None:
        self.told: list[dict[str, Any]] = []
        self.answer: dict[str, Any] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.told.append({"path": self.path, **json.loads(body)})
                data = json.dumps(server.answer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture()
def node_api() -> Iterator[NodeApiStub]:
    api = NodeApiStub()
    threading.Thread(target=api.serve_forever, daemon=True).start()
    yield api
    api.shutdown()
    api.server_close()
