"""What the daemon's own HTTP servers share (the mesh store, the node API): up or not,
where they serve, and a close that stops their thread and frees the port."""

from __future__ import annotations

import http.server


class Served:
    """A server the daemon starts while it leads (``ports.ServedStore``); ``listen`` is
    where it asked to serve, ``_httpd`` the server once started."""

    listen: tuple[str, int]
    _httpd: http.server.ThreadingHTTPServer | None = None

    @property
    def up(self) -> bool:
        return self._httpd is not None

    @property
    def address(self) -> tuple[str, int]:
        """Where it serves (the port bound, where ``listen`` asked for any)."""
        if self._httpd is None:
            return self.listen
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
