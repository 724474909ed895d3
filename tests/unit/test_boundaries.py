"""Broad catches only at boundaries: every ``except Exception`` in the product sits where
a thread or a loop must outlive a defect, contains it (logged with code and traceback,
counted) and is listed in docs/architecture.md; every ``except BaseException`` undoes
and re-raises; there is no bare ``except:``."""

from __future__ import annotations

import ast
import logging
import re
import threading

import pytest

from slurm_burst.adapters.metrics.prom import Metrics
from slurm_burst.core.errors import BurstError
from slurm_burst.services.periodic import contain, every
from tests.conftest import ROOT
from tests.fakes.clock import FakeClock
from tests.unit.test_metrics import sample

pytestmark = pytest.mark.unit

PACKAGE = ROOT / "slurm_burst"
DOC = ROOT / "docs" / "architecture.md"


def _handlers() -> list[tuple[str, str, str, ast.ExceptHandler]]:
    """(file under slurm_burst/, enclosing Class.function, what it catches, handler)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(PACKAGE).as_posix()

        def visit(node: ast.AST, scope: tuple[str, ...], rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    visit(child, (*scope, child.name))
                    continue
                if isinstance(child, ast.ExceptHandler):
                    caught = ast.unparse(child.type) if child.type is not None else ""
                    if caught == "" or re.search(r"\b(Base)?Exception\b", caught):
                        found.append((rel, ".".join(scope), caught, child))
                visit(child, scope)

        visit(tree, ())
    return found


HANDLERS = _handlers()


def _documented() -> set[tuple[str, str]]:
    """The table of survivors in docs/architecture.md: (file, Class.function)."""
    text = DOC.read_text()
    section = text.split("**Broad catches, only at boundaries.**", 1)[1].split("\n\n**", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 3 or "`" not in cells[1]:
            continue
        names = re.findall(r"`([^`]+)`", cells[1])
        for fn in names[1:]:
            rows.add((names[0].removeprefix("slurm_burst/"), fn))
    return rows


def test_there_is_no_bare_except() -> None:
    bare = [(f, fn, h.lineno) for f, fn, caught, h in HANDLERS if caught == ""]
    assert not bare, bare


def test_base_exception_is_caught_only_to_undo_and_raise_again() -> None:
    section = DOC.read_text().split("`except BaseException` appears only", 1)[1]
    section = section.split("\n\n", 1)[0]
    base = [(f, fn, h) for f, fn, caught, h in HANDLERS if caught == "BaseException"]
    assert base, "the scan found none: is it still looking?"
    for f, fn, h in base:
        last = h.body[-1]
        assert isinstance(last, ast.Raise) and last.exc is None, f"{f}:{h.lineno} ({fn})"
        tail = fn.split(".")[-1]
        assert f"{tail}`" in section, f"{f} {fn}: not named in docs/architecture.md"


def test_every_broad_catch_is_a_listed_boundary_that_contains_or_raises_a_coded_error() -> None:
    broad = [(f, fn, h) for f, fn, caught, h in HANDLERS if caught != "BaseException"]
    for f, fn, h in broad:
        calls = {
            n.func.id
            for n in ast.walk(h)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        raises = [n for n in ast.walk(h) if isinstance(n, ast.Raise) and n.exc is not None]
        assert "contain" in calls or raises, f"{f}:{h.lineno} ({fn}) neither contains nor raises"
    in_code = {(f, fn) for f, fn, _ in broad}
    assert in_code == _documented(), "docs/architecture.md's table of broad catches is stale"


def test_contain_logs_the_code_and_the_traceback_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = Metrics()
    with caplog.at_level(logging.ERROR):
        for exc in (KeyError("gone"), BurstError("slurm away", "SlurmDown")):
            try:
                raise exc
            except Exception as caught:
                contain("reconcile.pass", caught, m)
    said = [r for r in caplog.records if r.getMessage().startswith("reconcile.pass_failed")]
    assert [r.getMessage().split(" error=")[0] for r in said] == [
        "reconcile.pass_failed code=KeyError",
        "reconcile.pass_failed code=SlurmDown",
    ]
    # the traceback: on the record, or already formatted into it by the CLI's redacting
    # filter (cli/common.py), which an earlier test of the session may have put on the
    # root logger's handlers
    assert all((r.exc_info and r.exc_info[2]) or "Traceback" in (r.exc_text or "") for r in said)
    for code in ("KeyError", "SlurmDown"):
        got = sample(m, "slurm_burst_contained_errors_total", where="reconcile.pass", code=code)
        assert got == 1.0, code


def test_a_loop_outlives_a_pass_that_fails_and_counts_it() -> None:
    m = Metrics()
    stop = threading.Event()
    passes: list[int] = []

    def step() -> None:
        passes.append(1)
        if len(passes) == 1:
            raise ZeroDivisionError("a defect")
        stop.set()

    every(0.0, stop, FakeClock(), step, "policy.pass", m)
    assert len(passes) == 2  # the second pass ran after the first one failed
    got = sample(m, "slurm_burst_contained_errors_total", where="policy.pass",
                 code="ZeroDivisionError")  # fmt: skip
    assert got == 1.0
