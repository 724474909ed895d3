"""One error model: every error class of the product derives from BurstError, with a
stable code (explained in docs/operations.md) and an exit code; the command line maps
each to its exit code in one place, with its message and no traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner

import slurm_burst
from slurm_burst import extensions
from slurm_burst.cli.common import EXIT_CODES
from slurm_burst.cli.main import cli
from slurm_burst.config.schema import Problem
from slurm_burst.core.errors import BurstError
from slurm_burst.extensions import Plugin
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

# exceptions that never reach a user, and why
INTERNAL = {
    "slurm_burst.services.provisioner.Cancelled": "control flow: a step stops when its "
    "node is wanted down or the daemon stops; caught in Provisioner.drive",
    "slurm_burst.services.provisioner.Later": "control flow: a step that waits hands its "
    "node to a timer (Workers._work), or sleeps in a blocking Provisioner.drive",
    "slurm_burst.services.provisioner.NeedsJoinSlot": "control flow: a node ready to "
    "bootstrap moves to the join pool (Workers._work)",
    "slurm_burst.services.provisioner.Relaunch": "control flow: a node falling back from "
    "spot is launched again with the others (Workers._work), or at once in a blocking "
    "Provisioner.drive",
    "slurm_burst.adapters.cloud.attest.NoSource": "a LibcloudError inside the cloud "
    "adapter, turned into the node's HostKeys failure there",
    "slurm_burst.node.stagein.Refused": "the node's stage-in program (standard library "
    "only, run over SSH): its errors are its JSON answer and exit code, read by the daemon",
    "slurm_burst.node.stagein.Corrupt": "inside the node's stage-in program: a bad copy "
    "fetched again, or its file's Refused",
    "slurm_burst.node.stageout.Refused": "the node's stage-out program (standard library "
    "only, run over SSH): its errors are its JSON answer and exit code, read by the daemon",
}


def _error_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(slurm_burst.__path__, "slurm_burst."):
        if ".migrations." in info.name or info.name.endswith("__main__"):
            continue  # Alembic's revision scripts run under Alembic; __main__ runs the CLI
        module = importlib.import_module(info.name)
        for _name, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


CLASSES = _error_classes()


def _name(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_the_walk_finds_the_products_errors() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"ConfigError", "LedgerError", "HostlistError", "CommandError", "DaemonError",
            "CredentialsError", "TransitionError", "FileRefused",
            "ExtensionError"} <= names  # fmt: skip
    assert len(CLASSES) > 30


@pytest.mark.parametrize("cls", CLASSES, ids=_name)
def test_every_error_is_a_burst_error_with_a_code_and_an_exit_code(
    cls: type[BaseException],
) -> None:
    if _name(cls) in INTERNAL:
        return
    assert issubclass(cls, BurstError), f"{_name(cls)} is outside the error model"
    assert re.fullmatch(r"[A-Z][A-Za-z]+(\.[A-Za-z-]+)?", cls.code), cls.code
    assert cls.exit_code in EXIT_CODES and cls.exit_code != 0
    runbook = (ROOT / "docs" / "operations.md").read_text()
    assert f"`{cls.code}`" in runbook, f"{cls.code} is not explained in docs/operations.md"


def _instance(cls: type[BurstError]) -> BurstError:
    """One of ``cls``, its message 'the broken thing' (each constructor as it is)."""
    msg = "the broken thing"
    c: Any = cls  # each constructor as it is
    special = {
        "HostlistError": lambda: c("n[", 1, msg),
        "CommandError": lambda: c(["scontrol"], 1, msg, "failed"),
        "ConfigError": lambda: c("cfg.toml", [Problem("a.b", msg)]),
        "StepError": lambda: c("Bootstrap.x", msg),
    }
    make = special.get(cls.__name__)
    if make:
        made: BurstError = make()
        return made
    required = [
        p for p in inspect.signature(cls.__init__).parameters.values()
        if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "self"
    ]  # fmt: skip
    if not any(p.name == "message" for p in required):
        return c(*["What"] * (len(required) - 1), msg)  # type: ignore[no-any-return]
    return c(**{p.name: msg if p.name == "message" else "What" for p in required})  # type: ignore[no-any-return]


RAISE: list[BaseException] = []


@click.command("boom")
def boom() -> None:
    raise RAISE[0]


@pytest.fixture
def boom_command() -> Iterator[None]:
    extensions.use((Plugin(name="t", commands={"boom": f"{__name__}:boom"}),))
    yield
    extensions.use(None)
    RAISE.clear()


@pytest.mark.parametrize("cls", [c for c in CLASSES if issubclass(c, BurstError)], ids=_name)
def test_the_cli_maps_each_error_to_its_exit_code_in_one_place(
    cls: type[BurstError], boom_command: None
) -> None:
    err = _instance(cls)
    RAISE[:] = [err]
    out = CliRunner().invoke(cli, ["boom"])
    assert out.exit_code == cls.exit_code, (out.output, out.exception)
    assert out.output.startswith("slurm-burst: error: ") and "broken thing" in out.output
    assert "Traceback" not in out.output


def test_an_error_that_is_not_ours_is_not_hidden(boom_command: None) -> None:
    """A bug stays a bug: the traceback is kept (click's runner sees the exception)."""
    RAISE[:] = [KeyError("x")]
    out = CliRunner().invoke(cli, ["boom"])
    assert out.exit_code == 1 and isinstance(out.exception, KeyError)
