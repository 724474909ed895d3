"""A WSGI app served on 127.0.0.1 in a thread of its own: the lab's API emulators."""

from __future__ import annotations

import logging
import threading
from typing import Any


def serve(app: Any, name: str, port: int = 0) -> Any:
    """Serve ``app`` on 127.0.0.1:``port`` (0: any free port) in a daemon thread named
    ``name``; the server (its ``server_port`` is where it listens)."""
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", port, app, threaded=True)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def shut(server: Any) -> None:
    """Stop serving and close the socket (``server`` None: nothing to do)."""
    if server is not None:
        server.shutdown()
        server.server_close()
