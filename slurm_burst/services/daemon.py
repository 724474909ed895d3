"""``slurm-burst daemon``: takes the hooks' requests and drives each node's state machine.

One process per controller host (an exclusive lock on the state directory).
The main thread waits on the wake-up socket (or ``poll_period``), writes the
heartbeat the hooks check, turns pending requests into each node's ``want``,
and hands nodes that need work to a pool of ``daemon.workers`` threads, at
most one worker per node. After a crash or restart, every node whose state is
not where its ``want`` says is picked up again from the database: the steps
are idempotent, so finishing a half-done step is safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from slurm_burst.adapters.ha import SoleLeader
from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import LIVE, RESUMING
from slurm_burst.core.nodestate import NodeState as S
from slurm_burst.services.chargeback import Chargeback, ChargebackLoop
from slurm_burst.services.provisioner import Provisioner
from slurm_burst.services.reconciler import Reconciler

log = logging.getLogger(__name__)


class DaemonError(RuntimeError):
    pass


class Daemon:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        provisioner: Provisioner,
        chargeback: Chargeback | None = None,
        clock: Callable[[], float] = time.time,
        reconciler: Reconciler | None = None,
        leader: Any | None = None,
        metrics: Any | None = None,
    ) -> None:
        self.cfg = cfg
        self.ledger_loop = (
            ChargebackLoop(cfg, chargeback, provisioner.ledger) if chargeback else None
        )
        self.store = store
        self.prov = provisioner
        self.reconciler = reconciler
        self.node_id = cfg.daemon.node_id or socket.gethostname()
        self.leader = leader if leader is not None else SoleLeader(self.node_id)
        self.metrics = metrics
        self.now = clock
        self.stop = threading.Event()
        provisioner.stopping = self.stop  # a stopping daemon's workers end their waits
        self.pool = ThreadPoolExecutor(cfg.daemon.workers, thread_name_prefix="node")
        self._active: dict[str, Future[None]] = {}
        self._again: set[str] = set()
        self._force: set[str] = set()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._lockfile: int | None = None
        self._reconcile_thread: threading.Thread | None = None
        self.leading = False
        self.lost_leadership = False  # set when the HA lock is lost: the CLI exits 1
        self.started_at = clock()

    # -- lifecycle ------------------------------------------------------------------
    def acquire(self) -> None:
        """One daemon per host: an exclusive lock on the state directory.

        With HA each daemon has its own lock file (``daemon.<node_id>.lock``), so two
        daemons may share a state directory on shared storage; the election decides
        which one acts.
        """
        state = Path(self.cfg.daemon.state_dir)
        state.mkdir(parents=True, exist_ok=True, mode=0o750)
        name = f"daemon.{self.node_id}.lock" if self.cfg.daemon.ha_url else "daemon.lock"
        fd = os.open(state / name, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonError(f"another slurm-burst daemon holds {state / name}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lockfile = fd

    def open_socket(self) -> None:
        path = Path(self.cfg.daemon.socket)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        os.chmod(path, 0o660)  # the hooks run as SlurmUser: give its group access
        sock.settimeout(1.0)
        self._sock = sock

    def run(self) -> None:
        self.acquire()
        if self.metrics is not None and self.cfg.daemon.metrics_listen:
            try:
                self.metrics.serve(self.cfg.daemon.metrics_listen)
            except OSError as exc:  # metrics are not worth refusing to provision for
                log.error(
                    "daemon.metrics_unavailable listen=%s error=%s",
                    self.cfg.daemon.metrics_listen,
                    exc,
                )
        log.info("daemon.started pid=%d node_id=%s", os.getpid(), self.node_id)
        try:
            while not self.stop.is_set():
                if not self.leading:
                    if self.leader.try_acquire():
                        self.lead()
                    else:
                        self.follow()
                        self.stop.wait(self.cfg.daemon.poll_period)
                        continue
                self.beat()
                self.handle_requests()
                self._wait()
        finally:
            self.shutdown()

    def lead(self) -> None:
        """Become the acting daemon: wake-up socket, ledger thread, recovery, reconcile."""
        self.leading = True
        if self.metrics is not None:
            self.metrics.leader.set(1)
        log.info("daemon.leader node_id=%s", self.node_id)
        self.store.event(self.now(), "daemon.leader", "", self.node_id)
        self.store.meta_delete(f"follower.{self.node_id}")
        self.open_socket()
        self.beat()
        self.restore_peers()
        if self.ledger_loop is not None:
            self.ledger_loop.ensure_schema()  # db upgrade at start, under the migration lock
            self.ledger_loop.start()  # spool replay, ingest, split: now, then every interval
        self.recover()
        self._reconcile_thread = threading.Thread(
            target=self._reconcile_loop, name="reconcile", daemon=True
        )
        self._reconcile_thread.start()

    def restore_peers(self) -> None:
        """Put every live node's peer on the hub (idempotent).

        After a takeover on another host the hub there has none of the leader's peers;
        the nodes' tunnels reconnect to the (floating) hub endpoint once their peers exist.
        """
        live = [r for r in self.store.nodes() if r.state in LIVE and r.wg_pubkey and r.mesh_addr]
        if not live:
            return
        try:
            present = {p.public_key for p in self.prov.mesh.peers()}
            for r in live:
                if r.wg_pubkey not in present:
                    self.prov.mesh.add_peer(r.wg_pubkey, r.mesh_addr, r.name)
                    log.info("daemon.peer_restored node=%s mesh_addr=%s", r.name, r.mesh_addr)
        except Exception as exc:  # the reconcile pass reports the hub; provisioning goes on
            log.error("daemon.peer_restore_failed error=%s", exc)

    def follow(self) -> None:
        """Standby: say so (``slurm-burst status`` shows it), act on nothing."""
        if self.metrics is not None:
            self.metrics.leader.set(0)
        self.store.meta_set(
            f"follower.{self.node_id}",
            {"at": self.now(), "pid": os.getpid(), "leader": self.leader.leader_info()},
        )

    def _reconcile_loop(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            if not self.leader.held():
                log.critical("daemon.leadership_lost node_id=%s: stopping", self.node_id)
                self.lost_leadership = True
                self.stop.set()
                return
            if self.reconciler is not None:
                try:
                    self.reconciler.pass_once()
                except Exception:
                    log.exception("reconcile.pass_failed")
            self.rescan()
            self.stop.wait(max(0.0, self.cfg.daemon.poll_period - (time.monotonic() - started)))

    def _wait(self) -> None:
        assert self._sock is not None
        try:
            self._sock.recv(64)
            while True:  # drain a burst of wake-ups
                self._sock.setblocking(False)
                self._sock.recv(64)
        except (TimeoutError, BlockingIOError, InterruptedError):
            pass
        finally:
            self._sock.settimeout(1.0)

    def shutdown(self) -> None:
        log.info("daemon.stopping in_flight=%d", len(self._active))
        if self._reconcile_thread is not None:
            self._reconcile_thread.join(timeout=60)
        self.leader.release()
        if self.ledger_loop is not None:
            self.ledger_loop.stop.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self._sock is not None:
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                Path(self.cfg.daemon.socket).unlink()

    def beat(self) -> None:
        if self.metrics is not None:
            self.metrics.heartbeat.set(self.now())
        self.store.beat(
            self.now(),
            {
                "pid": os.getpid(),
                "node_id": self.node_id,
                "started_at": self.started_at,
                "in_flight": len(self._active),
            },
        )

    # -- requests -----------------------------------------------------------------
    def handle_requests(self) -> None:
        for req in self.store.pending_requests():
            jobs = json.dumps(req.jobs)
            launch: list[str] = []  # nodes newly asked up: launched in batches first
            for name in req.nodes:
                group = self.cfg.group_of(name)
                if group is None:
                    log.warning("request.unknown_node request=%d node=%s", req.id, name)
                    continue
                rec = self.store.node(name)
                if req.kind == "resume":
                    if rec is not None and rec.state in RESUMING and rec.want == "up":
                        log.info("node.resume.duplicate node=%s state=%s", name, rec.state)
                        continue
                    if rec is None or rec.state == S.TERMINATED:
                        self.store.transition(
                            name,
                            S.REQUESTED,
                            self.now(),
                            grp=group.name,
                            want="up",
                            launch_seq=(rec.launch_seq + 1) if rec else 1,
                            requested_at=req.created_at,
                            jobs=jobs,
                            error="",
                            message="",
                        )
                        launch.append(name)
                        continue
                    self.store.update(name, want="up", jobs=jobs)
                else:
                    if rec is None:
                        self.store.transition(name, S.TERMINATED, self.now(), grp=group.name)
                    elif rec.want != "down":
                        self.store.update(name, want="down")
                    if req.kind == "resume-fail":
                        with self._lock:
                            self._force.add(name)
                self.submit(name)
            if launch:
                self.submit_launch(launch)
            self.store.finish_request(req.id, self.now())
            log.info(
                "request.done id=%d kind=%s count=%d hostlist=%s",
                req.id,
                req.kind,
                len(req.nodes),
                compress(list(req.nodes)),
            )

    # -- workers ------------------------------------------------------------------
    def submit(self, name: str) -> None:
        with self._lock:
            if name in self._active:
                self._again.add(name)  # the worker re-reads the node before it ends
                return
            self._active[name] = self.pool.submit(self._work, name)

    def submit_launch(self, names: list[str]) -> None:
        """Launch ``names`` in batches on one worker, then drive each on its own."""
        with self._lock:
            free = [n for n in names if n not in self._active]
            busy = [n for n in names if n in self._active]
            if free:
                fut = self.pool.submit(self._launch_work, free)
                for n in free:
                    self._active[n] = fut
        for n in busy:
            self.submit(n)

    def _launch_work(self, names: list[str]) -> None:
        try:
            self.prov.launch_batch(names)
        except Exception:
            log.exception("node.batch_launch_crashed count=%d", len(names))
        finally:
            with self._lock:
                for n in names:
                    self._active.pop(n, None)
                    self._again.discard(n)
            for n in names:
                self.submit(n)

    def _work(self, name: str) -> None:
        try:
            while True:
                try:
                    self.prov.drive(name)
                except Exception:
                    log.exception("node.worker_crashed node=%s", name)
                with self._lock:
                    if name in self._again:
                        self._again.discard(name)
                        continue
                    force = name in self._force
                    self._force.discard(name)
                    break
            if force:
                self.prov.power_down_force(name)
        finally:
            with self._lock:
                self._active.pop(name, None)

    def recover(self) -> None:
        """After a (re)start: pick up every node that is not where it should be."""
        todo = [r.name for r in self.store.nodes() if _needs_work(r.state, r.want)]
        if todo:
            log.info("daemon.recover count=%d hostlist=%s", len(todo), compress(todo))
        for name in todo:
            self.submit(name)

    def rescan(self) -> None:
        for rec in self.store.nodes():
            if _needs_work(rec.state, rec.want) and rec.name not in self._active:
                self.submit(rec.name)

    def idle(self) -> bool:
        with self._lock:
            return not self._active


def _needs_work(state: S, want: str) -> bool:
    if want == "up":
        return state != S.JOINED
    return state != S.TERMINATED
