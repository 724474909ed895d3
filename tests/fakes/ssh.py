"""Cloud nodes' SSH side in memory: a connector, sessions, and nodes that run the
bootstrap script's steps.

A :class:`FakeNode` understands a few plain commands (``true``, ``false``, ``echo``,
``cat``, ``stat -c %a``; what the contract suite runs) and the steps of
``slurm_burst/node/bootstrap.sh`` (``sh SCRIPT STEP ARGS``), with their effects on
the node: a WireGuard key made once, the tunnel's first handshake with the hub,
munged and slurmd started. ``fail`` makes a step exit non-zero.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_burst.core.remote import RemoteError
from slurm_burst.ports import Clock
from tests.fakes.mesh import FakeMesh, wg_key

MUNGE_IDS = "998:998"


@dataclass
class FakeNode:
    host: str
    host_keys: list[tuple[str, str]]
    mesh: FakeMesh | None = None
    files: dict[str, tuple[bytes, int, tuple[int, int] | None]] = field(default_factory=dict)
    ran: list[list[str]] = field(default_factory=list)
    fail: dict[str, str] = field(default_factory=dict)  # step or command -> stderr
    wg_pub: str = ""
    munged: bool = False
    slurmd: str = ""  # the node name slurmd was started as
    slurmd_version: str = "22.05.8"  # what slurmd -V says
    bad_key: bool = False  # wg-key prints garbage
    # what the GPU check prints (gpu-check step) and a telemetry sample (gpucheck.py sample)
    gpu_report: dict[str, object] = field(default_factory=lambda: {"ok": True, "problems": []})
    gpu_sample: dict[str, object] = field(default_factory=lambda: {"gpus": []})
    health_check: list[str] = field(default_factory=list)  # the health-check step's args
    # directories a file may be put in: an image's, then what the bootstrap steps make
    dirs: set[str] = field(default_factory=lambda: {"/run", "/etc", "/tmp", "/var/log"})
    agent: list[str] = field(default_factory=list)  # the agent-start step's args
    # the runtime-capture step prints the reference it was given with these fields
    # changed (None: left out): a node whose runtime differs
    runtime: dict[str, object] = field(default_factory=dict)

    def run(self, argv: Sequence[str]) -> str:
        self.ran.append(list(argv))
        if len(argv) >= 3 and argv[0] == "sh" and argv[1] in self.files:
            return self._step(argv[2], list(argv[3:]))
        cmd = argv[0] if argv else ""
        if cmd in self.fail:
            raise RemoteError(f"{self.host}: {cmd} exited 1: {self.fail[cmd]}", "RemoteCommand")
        if cmd == "true":
            return ""
        if len(argv) == 3 and argv[1] == "/etc/slurm-burst/gpucheck.py" and argv[2] == "sample":
            if "/etc/slurm-burst/gpucheck.py" not in self.files:
                raise RemoteError(f"{self.host}: {argv[0]}: no gpucheck.py", "RemoteCommand")
            return json.dumps(self.gpu_sample) + "\n"
        if cmd == "echo":
            return " ".join(argv[1:]) + "\n"
        if cmd == "cat" and len(argv) == 2 and argv[1] in self.files:
            return self.files[argv[1]][0].decode()
        if list(argv[:3]) == ["stat", "-c", "%a"] and len(argv) == 4 and argv[3] in self.files:
            return f"{self.files[argv[3]][1]:o}\n"
        raise RemoteError(f"{self.host}: {shlex.join(argv)} exited 1", "RemoteCommand")

    def _step(self, step: str, args: list[str]) -> str:
        if step in self.fail:
            raise RemoteError(
                f"{self.host}: sh bootstrap {step} exited 1: {self.fail[step]}", "RemoteCommand"
            )
        if step == "wg-key":
            self.dirs.add("/etc/wireguard")
            self.wg_pub = self.wg_pub or wg_key(f"node:{self.host}")
            return "not a key\n" if self.bad_key else self.wg_pub + "\n"
        if step == "wg-up":
            if len(args) < 3 or args[2] not in self.files:
                raise RemoteError(f"{self.host}: wg-up: no config {args[2:3]}", "RemoteCommand")
            if self.mesh is not None and self.wg_pub:
                self.mesh.handshake(self.wg_pub)
            return ""
        if step == "munge-dirs":
            self.dirs.add("/etc/munge")
            return MUNGE_IDS + "\n"
        if step == "munge-start":
            if "/etc/munge/munge.key" not in self.files:
                raise RemoteError(f"{self.host}: munged: no key", "RemoteCommand")
            self.munged = True
            return ""
        if step == "gpu-prepare":
            self.dirs.add("/etc/slurm-burst")
            return ""
        if step == "agent-start":
            if "/run/slurm-burst-agent.py" not in self.files:
                raise RemoteError(f"{self.host}: agent-start: no agent", "RemoteCommand")
            self.agent = list(args)
            return ""
        if step == "gpu-check":
            for need in ("/etc/slurm-burst/gpucheck.py", "/etc/slurm-burst/gpu-check.json"):
                if need not in self.files:
                    raise RemoteError(f"{self.host}: gpu-check: no {need}", "RemoteCommand")
            return json.dumps(self.gpu_report) + "\n"
        if step == "runtime-capture":
            ref = "/etc/slurm-burst/runtime-reference.json"
            for need in ("/etc/slurm-burst/runtime.py", ref):
                if need not in self.files:
                    raise RemoteError(f"{self.host}: runtime-capture: no {need}", "RemoteCommand")
            doc = {**json.loads(self.files[ref][0]), **self.runtime, "source": "node"}
            return json.dumps({k: v for k, v in doc.items() if v is not None}) + "\n"
        if step == "health-check":
            self.health_check = list(args)
            return ""
        if step == "slurmd-version":
            return f"slurm {self.slurmd_version}\n"
        if step == "slurmd-start":
            if not self.munged:
                raise RemoteError(f"{self.host}: slurmd: munge not running", "RemoteCommand")
            self.slurmd = args[0]
            return ""
        if step == "diagnose":
            state = f"running as {self.slurmd}" if self.slurmd else "not running"
            return f"slurmd: {state}\nslurmd: error: fetch_config: failed (fake)\n"
        raise RemoteError(f"{self.host}: unknown step: {step}", "RemoteCommand")


class FakeShell:
    """The RemoteShell port on a :class:`FakeNode`."""

    def __init__(self, node: FakeNode, fail_put: set[str]) -> None:
        self.node = node
        self.fail_put = fail_put
        self.closed = False

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        if self.closed:
            raise RemoteError(f"{self.node.host}: session closed", "RemoteCommand")
        return self.node.run(argv)

    def put(self, data: bytes, path: str, mode: int, owner: tuple[int, int] | None = None) -> None:
        if self.closed or path in self.fail_put:
            raise RemoteError(f"{self.node.host}: sftp put {path}: failure", "RemoteCommand")
        if path.rpartition("/")[0] not in self.node.dirs:  # as SFTP: no directory, no file
            raise RemoteError(f"{self.node.host}: sftp put {path}: [Errno 2] No such file",
                              "RemoteCommand")  # fmt: skip
        self.node.files[path] = (bytes(data), mode, owner)

    def close(self) -> None:
        self.closed = True


class FakeConnector:
    """The Connector port. A host is reachable once it is in ``nodes`` (or ``keys_of``
    finds keys for it: the fake cloud's running instances); any other host never
    answers, so a connect waits on the clock until its deadline and fails as SSH
    would."""

    def __init__(
        self,
        clock: Clock,
        mesh: FakeMesh | None = None,
        keys_of: Callable[[str], list[tuple[str, str]] | None] | None = None,
    ) -> None:
        self.clock = clock
        self.mesh = mesh
        self.keys_of = keys_of  # host -> the keys its sshd really has (None: nothing there)
        self.nodes: dict[str, FakeNode] = {}
        self.fail_put: set[str] = set()  # paths whose upload fails
        self.fail_steps: dict[str, str] = {}  # every new node fails these steps
        self.bad_wg_key = False  # every new node prints garbage for its WireGuard key
        self.slurmd_version = "22.05.8"  # every new node's slurmd -V
        self.gpu_report: dict[str, object] | None = None  # every new node's GPU check says
        self.runtime: dict[str, object] = {}  # every new node's runtime differs so
        self.sessions: list[FakeShell] = []
        self._lock = threading.Lock()

    def node_at(self, host: str, host_keys: list[tuple[str, str]]) -> FakeNode:
        with self._lock:
            if host not in self.nodes:
                self.nodes[host] = FakeNode(
                    host,
                    host_keys,
                    self.mesh,
                    fail=dict(self.fail_steps),
                    bad_key=self.bad_wg_key,
                    slurmd_version=self.slurmd_version,
                )
                if self.gpu_report is not None:
                    self.nodes[host].gpu_report = dict(self.gpu_report)
                self.nodes[host].runtime = dict(self.runtime)
            return self.nodes[host]

    def _lookup(self, host: str) -> FakeNode | None:
        if host in self.nodes:
            return self.nodes[host]
        keys = self.keys_of(host) if self.keys_of is not None else None
        return None if keys is None else self.node_at(host, keys)

    def connect(
        self, host: str, host_keys: Sequence[tuple[str, str]], deadline: float
    ) -> FakeShell:
        if not host_keys:
            raise RemoteError(f"{host}: no attested host key to trust", "HostKeyUnknown")
        while (node := self._lookup(host)) is None:
            if self.clock.monotonic() >= deadline:
                raise RemoteError(f"{host}: ssh not reachable", "SshUnreachable")
            self.clock.sleep(0.5)
        if not {tuple(k) for k in host_keys} & {tuple(k) for k in node.host_keys}:
            raise RemoteError(
                f"{host}: host key does not match the attested one", "HostKeyMismatch"
            )
        shell = FakeShell(node, self.fail_put)
        self.sessions.append(shell)
        return shell
