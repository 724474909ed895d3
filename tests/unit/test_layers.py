"""The layering holds: the core is pure, services know ports only, adapters know no
service, one module (the composition root, ``wiring.py``) names the adapters, and the
product never imports the lab (a distribution of its own that plugs in through
slurm_burst.extensions)."""

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
    forbidden = ("slurm_burst.adapters", "slurm_burst.wiring", "slurm_burst.cli")
    libraries = ("libcloud", "paramiko", "sqlalchemy", "alembic", "prometheus_client", "click")
    for name in _imports(path):
        assert not name.startswith(forbidden), f"{_rel(path)} imports {name}"
        assert name.split(".")[0] not in libraries, f"{_rel(path)} imports {name}"


@pytest.mark.parametrize("path", _modules("cli"), ids=_rel)
def test_commands_reach_adapters_through_the_composition_root(path: Path) -> None:
    for name in _imports(path):
        assert not name.startswith("slurm_burst.adapters"), (
            f"{_rel(path)} imports {name}: build it in slurm_burst/wiring/"
        )


PRODUCT = sorted(PKG.rglob("*.py"))


@pytest.mark.parametrize("path", PRODUCT, ids=_rel)
def test_the_product_never_imports_the_lab(path: Path) -> None:
    for name in _imports(path):
        assert name.split(".")[0] != "slurm_burst_lab", f"{_rel(path)} imports {name}"
    text = path.read_text()
    assert "slurm_burst_lab" not in text, (
        f"{_rel(path)} names the lab's package (a dotted name in a string is an import too)"
    )


def test_the_lab_is_not_inside_the_product() -> None:
    assert not (PKG / "lab").exists()
    assert not list(PKG.rglob("*nscloud*")) and not list(PKG.rglob("*simnvml*"))


@pytest.mark.parametrize("path", _modules("adapters"), ids=_rel)
def test_adapters_know_no_service(path: Path) -> None:
    for name in _imports(path):
        assert not name.startswith(("slurm_burst.services", "slurm_burst.cli")), (
            f"{_rel(path)} imports {name}: an adapter implements a port; give it core types"
        )


def test_the_layering_test_sees_a_lab_import(tmp_path: Path) -> None:
    """The checks above read imports inside functions too (the product's habit)."""
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from slurm_burst_lab.faults import wrap\n    return wrap\n")
    assert "slurm_burst_lab.faults" in _imports(bad)


def _constructors() -> list[tuple[str, int]]:
    out = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                        a = fn.args
                        count = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)
                        out.append((f"{_rel(path)}:{node.name}", count))
    return out


def test_no_constructor_takes_more_than_8_parameters() -> None:
    """A service takes its settings (one frozen object) and the ports it uses; a long
    parameter list is a service doing too much, or settings not gathered."""
    found = _constructors()
    assert len(found) > 40  # the walk sees the product's classes
    assert [(name, n) for name, n in found if n > 8] == []
