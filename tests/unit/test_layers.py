"""The layering holds: the core is pure, services know ports only, and one module (the
composition root, ``wiring.py``) names the adapters."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PKG = ROOT / "slurm_burst"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _modules(*parts: str) -> list[Path]:
    base = PKG.joinpath(*parts)
    return sorted(base.rglob("*.py")) if base.is_dir() else [base]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", _modules("core"), ids=_rel)
def test_the_core_is_pure(path: Path) -> None:
    """stdlib and the core only: no adapter library, no service, no config."""
    for name in _imports(path):
        top = name.split(".")[0]
        if top == "slurm_burst":
            assert name.startswith("slurm_burst.core"), f"{_rel(path)} imports {name}"
        else:
            assert top in sys.stdlib_module_names or top == "__future__", (
                f"{_rel(path)} imports {name}, which is not the standard library"
            )


SERVICE_SIDE = [*_modules("services"), *_modules("ports.py")]


@pytest.mark.parametrize("path", SERVICE_SIDE, ids=_rel)
def test_services_and_ports_know_no_adapter(path: Path) -> None:
    forbidden = ("slurm_burst.adapters", "slurm_burst.lab", "slurm_burst.wiring",
                 "slurm_burst.cli")  # fmt: skip
    libraries = ("libcloud", "paramiko", "sqlalchemy", "alembic", "prometheus_client", "click")
    for name in _imports(path):
        assert not name.startswith(forbidden), f"{_rel(path)} imports {name}"
        assert name.split(".")[0] not in libraries, f"{_rel(path)} imports {name}"


@pytest.mark.parametrize("path", _modules("cli"), ids=_rel)
def test_commands_reach_adapters_through_the_composition_root(path: Path) -> None:
    for name in _imports(path):
        assert not name.startswith("slurm_burst.adapters"), (
            f"{_rel(path)} imports {name}: build it in slurm_burst/wiring.py"
        )
