"""A WSGI app served on 127.0.0.1 in a thread of its own: the lab's API emulators."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from typing import Any


def serve(app: Any, name: str, port: int = 0, ssl_context: Any = None) -> Any:
    """Serve ``app`` on 127.0.0.1:``port`` (0: any free port) in a daemon thread named
    ``name`` (over TLS with ``ssl_context``); the server (its ``server_port`` is where it
    listens)."""
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", port, app, threaded=True, ssl_context=ssl_context)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def serve_until_sigterm(app: Any, port: int, vms: Any = None, ssl_context: Any = None) -> None:
    """An emulator's own process (``python -m ...``): serve ``app`` on 127.0.0.1:``port``
    until SIGTERM, then halt the VMs it booted (``vms``, a LabVms, if any)."""
    import signal

    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", port, app, threaded=True, ssl_context=ssl_context)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    finally:
        if vms is not None:
            vms.halt_all()


def shut(server: Any) -> None:
    """Stop serving and close the socket (``server`` None: nothing to do)."""
    if server is not None:
        server.shutdown()
        server.server_close()


class Remote:
    """An emulator in another process (``python -m MODULE PORT ARGS...``) on a free
    loopback port, as the cloud is another service (a benchmark's daemon does not share
    its CPU); its control endpoint ``/_emulator/...`` read with :meth:`get`."""

    def __init__(self, module: str, args: list[str], what: str) -> None:
        import socket
        import sys
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", module, str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("calls")
                return
            except OSError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"the {what} did not start") from None
                time.sleep(0.2)

    def get(self, path: str) -> dict[str, Any]:
        import urllib.request

        url = f"http://127.0.0.1:{self.port}/_emulator/{path}"
        with urllib.request.urlopen(url, timeout=60) as r:
            return dict(json.loads(r.read()))

    def calls(self) -> dict[str, Any]:
        """The emulator's count of calls by method (and, GCE, its quota figures)."""
        return self.get("calls")

    def clear(self) -> None:
        self.get("clear")

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)
