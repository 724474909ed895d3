"""A fault-injecting wrapper around a libcloud driver: the lab's fault matrix.

Enabled by the lab config's ``[lab] fault_file``: the lab plugin wraps the lab cloud's
driver in it (:func:`wrap`, a driver wrapper of slurm_burst.extensions). The file holds
a JSON list of rules, read on every call, so a test injects a fault by writing the file
while the daemon runs::

    [{"call": "create_node", "error": "InsufficientInstanceCapacity", "size": "ns.cpu2",
      "times": 1},
     {"call": "create_node", "error": "RequestLimitExceeded", "http": 503, "times": 2},
     {"call": "create_node", "never_running": true, "node": "burst-cpu-7"},
     {"call": "create_node", "block": ["ipproto tcp sport 22"]},
     {"call": "create_node", "size": "ns.gpu1", "gpu": {"gpu1.xid": 79}, "times": 1}]

- ``error``: the call fails the way the provider would say it (an HTTP error
  whose message starts with the code), before anything is created.
- ``never_running``: the instance is created, but is listed as ``pending`` forever
  and prints no host key (an instance that never boots).
- ``delay_after``: the instance is created, and the call returns only after that
  many seconds (a crash in this window must not make a second instance).
- ``gpu``: the instance (a GPU size of the namespace cloud) is born with these
  changes to its simulated GPUs (``simnvml.FAULTS``: an XID, ECC errors...).
- ``block``: the instance is created and, once it runs, ``ip rule add SPEC
  blackhole`` is run inside it for each SPEC: real packets are dropped (SSH
  replies, WireGuard, slurmd to slurmctld).

``size`` and ``node`` narrow a rule; ``times`` (default: forever) counts down in
the file and the rule is removed when it reaches zero. Every firing is logged.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from libcloud.common.exceptions import BaseHTTPError
from libcloud.compute.base import Node
from libcloud.compute.types import NodeState

log = logging.getLogger(__name__)


class FaultyDriver:
    """Delegates to ``driver``; applies the rules of ``fault_file`` on the way."""

    def __init__(self, driver: Any, fault_file: str) -> None:
        self._driver = driver
        self._file = Path(fault_file)
        self._lock = threading.Lock()
        self._never_running: set[str] = set()
        self._block: dict[str, list[str]] = {}
        self._blocked: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    # -- rules ------------------------------------------------------------------
    def _take(self, call: str, **facts: str) -> dict[str, Any] | None:
        """The first rule matching ``call`` and ``facts``, counted down in the file."""
        with self._lock:
            try:
                rules = json.loads(self._file.read_text())
            except (FileNotFoundError, ValueError):
                return None
            for i, rule in enumerate(rules):
                if rule.get("call") != call:
                    continue
                if any(rule.get(k) not in (None, v) for k, v in facts.items()):
                    continue
                if "times" in rule:
                    rule["times"] -= 1
                    if rule["times"] <= 0:
                        rules.pop(i)
                    _write_json(self._file, rules)
                log.warning("fault.fired call=%s rule=%s facts=%s", call, rule, facts)
                return dict(rule)
        return None

    # -- the driver's calls ------------------------------------------------------
    def create_node(self, **kwargs: Any) -> Node:
        size = getattr(kwargs.get("size"), "id", "")
        rule = self._take("create_node", size=str(size), node=str(kwargs.get("name", "")))
        if rule is not None and "error" in rule:
            code = rule["error"]
            raise _http_error(rule, f"{code}: injected fault ({code})")
        if rule is not None and rule.get("gpu"):
            kwargs["ex_gpu_state"] = dict(rule["gpu"])
        node: Node = self._driver.create_node(**kwargs)
        if rule is not None and rule.get("delay_after"):  # created, not yet returned
            time.sleep(float(rule["delay_after"]))
        if rule is not None and rule.get("never_running"):
            self._never_running.add(str(node.id))
        if rule is not None and rule.get("block"):
            self._block[str(node.id)] = list(rule["block"])
        return node

    def list_nodes(self, *args: Any, **kwargs: Any) -> list[Node]:
        rule = self._take("list_nodes")
        if rule is not None and "error" in rule:
            raise _http_error(rule, f"{rule['error']}: injected fault")
        nodes = self._driver.list_nodes(*args, **kwargs)
        for n in nodes:
            if str(n.id) in self._never_running and n.state != NodeState.TERMINATED:
                n.state = NodeState.PENDING
        return list(nodes)

    def ex_get_console_output(self, node: Node) -> Any:
        nid = str(node.id)
        if nid in self._never_running:
            return ""
        out = self._driver.ex_get_console_output(node)
        if nid in self._block and nid not in self._blocked and out:
            self._apply_block(node, self._block[nid])
            self._blocked.add(nid)
        return out

    def destroy_node(self, node: Node) -> bool:
        rule = self._take("destroy_node")
        if rule is not None and "error" in rule:
            raise _http_error(rule, f"{rule['error']}: injected fault")
        return bool(self._driver.destroy_node(node))

    def _apply_block(self, node: Node, specs: list[str]) -> None:
        enter = self._driver.ex_enter_argv(node)
        for spec in specs:
            argv = [*enter, "ip", "rule", "add", *spec.split(), "blackhole"]
            subprocess.run(argv, check=True, timeout=10, capture_output=True)
            log.warning("fault.blocked instance=%s rule=%s", node.id, spec)


def _http_error(rule: dict[str, Any], message: str) -> Exception:
    """The error a provider's HTTP API returns (status from the rule, 400 by default)."""
    return BaseHTTPError(int(rule.get("http", 400)), message, {})  # type: ignore[no-untyped-call]


def _write_json(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".faults-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def wrap(cfg: Any, provider: str, driver: Any) -> Any:
    """The lab's driver wrapper (slurm_burst.extensions): the lab cloud's calls go through
    the fault matrix when the config's ``[lab]`` names a ``fault_file``."""
    from slurm_burst_lab.config import NAME, LabConfig

    lab = cfg.section(NAME)
    if isinstance(lab, LabConfig) and lab.fault_file and provider == lab.cloud_provider:
        return FaultyDriver(driver, lab.fault_file)
    return driver
