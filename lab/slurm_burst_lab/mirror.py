"""TCP relays from a lab bridge to the host's side: how a blank lab VM gets apt, and how
a daemon deployed in a VM reaches the lab's EC2 emulator.

Lab VMs reach nothing beyond their bridge, and this host has neither iptables nor nft
to NAT them. A :class:`TcpRelay` listens on the bridge's own address and copies bytes
both ways to a target the host reaches. :class:`MirrorRelay` is the one for the Debian
mirror the host's apt uses (``images.host_mirror``), on the mirror's port: a VM that pins
the mirror's name to the bridge address in its /etc/hosts then runs ``apt-get``
unchanged (the HTTP Host header, or TLS's SNI, still names the mirror). Bytes are not
looked at; nothing is cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Self
from urllib.parse import urlsplit

from slurm_burst_lab.images import host_mirror


class TcpRelay:
    """Accept on ``listen``:``port`` (0: a free port, then in ``port``) and relay each
    connection to ``host``:``target_port`` (default: the same port)."""

    def __init__(self, listen: str, port: int, host: str, target_port: int = 0) -> None:
        self.listen = listen
        self.port = port
        self.host = host
        self.target_port = target_port or port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=self._run, name=f"relay-{self.listen}:{self.port}", daemon=True
        )
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"relay on {self.listen}:{self.port}: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            server = loop.run_until_complete(
                asyncio.start_server(self._handle, self.listen, self.port)
            )
            self.port = int(server.sockets[0].getsockname()[1])
        except OSError as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.target_port), timeout=10
            )
        except (OSError, TimeoutError):
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))


class MirrorRelay(TcpRelay):
    """The relay to the host's Debian mirror (``mirror``: its URL, default the host's)."""

    def __init__(self, listen: str, mirror: str | None = None) -> None:
        url = urlsplit(mirror or host_mirror())
        if not url.hostname:
            raise ValueError(f"no host in the mirror URL {mirror!r}")
        super().__init__(listen, url.port or (443 if url.scheme == "https" else 80), url.hostname)

    def hosts_line(self) -> str:
        """The /etc/hosts line a VM needs: the mirror's name at the relay."""
        return f"{self.listen}\t{self.host}"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
