"""Lab fixtures: a real slurmctld (the shipped lab config) and a private namespace cloud."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab import images
from slurm_burst_lab.config import settings
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.cloud.registry import driver_class
from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config, load_config
from slurm_burst.wiring.clouds import cloud_driver
from slurm_burst.wiring.light import node_store
from tests.conftest import LAB_CONFIG, ROOT, invoke, wait
from tests.providers import azure, gce, http, openstack  # noqa: F401  (fixtures)

# (fault, outcome, reconcile passes to consistent, seconds to done): test_y_faults fills it
FAULT_MATRIX: list[tuple[str, str, str, str]] = []
# the soak's figures (test_z_soak fills it)
SOAK: dict[str, Any] = {}
# per-node step figures of the EC2 and GCE joins (test_x_ec2, test_x_gce fill it)
CLOUD_JOIN: dict[str, Any] = {}
# seconds of each step of the deployment's fixtures (test_x_deploy fills it)
DEPLOY: dict[str, float] = {}
# the GPU job whose GPU test_x_gpu kept 90 % busy: {"job": id} (test_y_ledger checks it)
GPU_BUSY_JOB: dict[str, str] = {}

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("slurmctld", path="/usr/sbin:/usr/bin"),
    reason="lab tests need root and Slurm (make test installs it; CI runs as root)",
)


# The lab's modules run in name order, but for these, which run after the others (and
# before test_y_ledger, which reads what the lab's jobs cost): they keep both cores busy
# (Ansible's plays, 25 and 32 VMs booting at once), and in make test the unit and
# integration tiers share the machine during the lab run's first part, in which the
# modules that mostly wait on Slurm's and the daemon's timers do better.
LATE = ("test_x_deploy.py", "test_x_ec2.py", "test_x_gce.py", "test_x_prolog.py")
LAST = ("test_y_ledger.py", "test_zy_demo.py", "test_zz_lab_down.py")


def _rank(item: pytest.Item) -> int:
    name = Path(str(item.fspath)).name
    return 2 if name in LAST else 1 if name in LATE else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slots = [i for i, item in enumerate(items) if "tests/lab/" in str(item.fspath)]
    for item in (items[i] for i in slots):
        item.add_marker(needs_root)
    ordered = sorted((items[i] for i in slots), key=_rank)  # stable: name order within
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item


DAEMON_LOG_TAIL = 40  # lines of the lab daemon's log a failed lab test's report carries


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A lab test that fails carries the daemon log's last lines (CI shows the report,
    and the lab's logs are gone with it)."""
    report = yield
    lab = getattr(item, "funcargs", {}).get("lab")
    if report.failed and report.when == "call" and isinstance(lab, Lab):
        try:
            with (lab.paths.log / "daemon.log").open("rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 256 * 1024))
                lines = fh.read().decode(errors="replace").splitlines()[-DAEMON_LOG_TAIL:]
        except OSError as exc:
            lines = [f"(not read: {exc})"]
        report.sections.append(("the lab daemon's log, its last lines", "\n".join(lines)))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CLOUD_JOIN:
        terminalreporter.section("EC2 and GCE joins (the lab's emulators)")
        for key, value in CLOUD_JOIN.items():
            terminalreporter.write_line(f"{key:<28} {value}")
    if DEPLOY:
        terminalreporter.section("deployment (seconds a step)")
        for key, secs in DEPLOY.items():
            terminalreporter.write_line(f"{key[:70]:<70} {secs:7.1f}")
    if SOAK:
        terminalreporter.section("soak")
        for key, value in SOAK.items():
            terminalreporter.write_line(f"{key:<28} {value}")
    if not FAULT_MATRIX:
        return
    w1 = max(len(r[0]) for r in FAULT_MATRIX)
    w2 = max(len(r[1]) for r in FAULT_MATRIX)
    tr = terminalreporter
    tr.section("fault matrix")
    tr.write_line(f"{'fault':<{w1}}  {'outcome':<{w2}}  passes  seconds to done")
    for fault, outcome, passes, seconds in FAULT_MATRIX:
        tr.write_line(f"{fault:<{w1}}  {outcome:<{w2}}  {passes:>6}  {seconds:>6}")


@pytest.fixture(scope="session")
def lab_config() -> Config:
    return load_config(LAB_CONFIG)


# The Slurm release the lab tests run on: the host's, unless SLURM_BURST_LAB_SLURM names
# another (make test runs the burst, budget and Slurm-state fault tests on each)
RELEASE = os.environ.get("SLURM_BURST_LAB_SLURM") or images.HOST_RELEASE


@pytest.fixture(scope="session")
def lab(lab_config: Config) -> Iterator[Lab]:
    """The lab, up on RELEASE. Left as found: a lab that was already up on it stays up."""
    the_lab = Lab(lab_config, release=RELEASE)
    was_up = the_lab.status()["up"] and the_lab.running_release() == RELEASE
    the_lab.up(timeout=90)
    yield the_lab
    if not was_up:
        the_lab.down()


@pytest.fixture(scope="module")
def nscloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A namespace cloud of its own (bridge, subnet, state), torn down afterwards."""
    state = tmp_path_factory.mktemp("nscloud")
    driver = driver_class("nscloud")(
        state_dir=str(state / "cloud"), bridge="sbt-br0", subnet="10.252.0.0/24", boot_delay=0.5
    )
    yield driver
    driver.ex_teardown()


@pytest.fixture(scope="module")
def store(lab: Lab, lab_config: Config) -> Iterator[Store]:
    """The running daemon's state database, read as the CLI reads it."""
    s = node_store(lab_config, create=False)
    yield s
    s.close()


@pytest.fixture(scope="module")
def env(lab: Lab) -> dict[str, str]:
    """The environment Slurm's commands need to reach the lab's slurmctld."""
    return lab.env()


@pytest.fixture
def faults(lab_config: Config) -> Iterator[Callable[[list[dict[str, Any]]], None]]:
    """Inject cloud faults through the lab provider's fault file; cleared afterwards,
    and the cpu group enabled again (failures of one case do not protect the next)."""
    path = Path(settings(lab_config).fault_file)

    def inject(rules: list[dict[str, Any]]) -> None:
        path.write_text(json.dumps(rules))

    yield inject
    path.unlink(missing_ok=True)
    invoke(["--config", str(LAB_CONFIG), "group", "enable", "cpu"])


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell as the README's commands find it: none of the Slurm variables these
    tests set (``SLURM_CONF``, ``SLURM_BURST_LAB_SLURM``), ``extra`` added."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | extra


def make(*argv: str) -> subprocess.CompletedProcess[str]:
    """``make ARGV`` in the checkout, from a user's shell (:func:`user_env`)."""
    return subprocess.run(["make", "--no-print-directory", *argv], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def sh(env: dict[str, str], *argv: str, check: bool = True) -> str:
    """Run a Slurm command against the lab; its output."""
    return subprocess.run(
        argv, env=env, text=True, capture_output=True, check=check, timeout=30
    ).stdout


def job_fields(env: dict[str, str], job: int) -> dict[str, str]:
    """``scontrol show job -o``'s fields of ``job`` (none once Slurm has forgotten it)."""
    out = sh(env, "scontrol", "show", "job", "-o", str(job), check=False)
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


@pytest.fixture(scope="module")
def cloud(lab_config: Config) -> Any:
    """The lab provider's libcloud driver (the namespace cloud, with the fault injector)."""
    return cloud_driver(lab_config.providers["lab"])


# -- the lab's Prometheus ------------------------------------------------------------


def prometheus_alerts(cfg: Config, name: str, **labels: str) -> list[str]:
    """The states (pending, firing) of the lab Prometheus' alerts ``name`` whose labels
    include ``labels``, read through its HTTP API."""
    from slurm_burst_lab.prometheus import api

    assert settings(cfg).prometheus
    return [
        a["state"]
        for a in api(settings(cfg).prometheus, "alerts")["alerts"]
        if a["labels"].get("alertname") == name
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


def await_alert(cfg: Config, name: str, firing: bool, timeout: float = 60, **labels: str) -> None:
    """Wait until alert ``name{labels}`` fires (``firing``) or is gone (not ``firing``)."""

    def check() -> bool:
        states = prometheus_alerts(cfg, name, **labels)
        return "firing" in states if firing else not states

    what = f"{name}{labels or ''} {'firing' if firing else 'resolved'} in the lab's Prometheus"
    wait(check, timeout, what, every=0.5)
