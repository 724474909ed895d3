"""The docs stay true to the code: generated sections current, links alive, every error
code the code can produce explained in the runbook, the README short."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

from slurm_burst.core.cloud import CODES, PHRASES
from slurm_burst.core.remote import REMOTE_CODES
from tests.conftest import ROOT, script

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _generator() -> ModuleType:
    return script("docs")


def test_generated_sections_are_current() -> None:
    stale = _generator().stale()
    assert stale == [], f"stale generated sections {stale}: run python scripts/docs.py"


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; long sections belong in docs/"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    for target in re.findall(r"\]\(([^)#:]+\.md)(#[^)]*)?\)", text):
        path = (page.parent / target[0]).resolve()
        assert path.exists(), f"{page.name} links to {target[0]}, which does not exist"
        anchor = target[1].lstrip("#")
        if anchor:
            heads = {
                re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)
            }
            assert anchor in heads, f"{page.name}: no heading #{anchor} in {target[0]}"


def _codes_in_code() -> set[str]:
    """Every failure code the daemon can put in a Slurm reason or an event."""
    codes = set(CODES) | {code for _, code, _ in PHRASES} | set(REMOTE_CODES)
    for path in (ROOT / "slurm_burst").rglob("*.py"):
        src = path.read_text()
        codes |= set(re.findall(r'StepError\(\s*"([A-Za-z.]+)"', src))
        codes |= set(re.findall(r'_as_step\("(\w+)"', src))
        codes |= set(re.findall(r'_past\(\s*\w+,\s*"(\w+)"', src))
        codes |= set(re.findall(r'reason\(\s*"(\w+)"', src))
        codes |= set(re.findall(r'_fail\(\w+, "(\w+)"', src))
        codes |= set(re.findall(r'Error\(\s*(?:f?"[^"]*"\s*)+,\s*"(\w+)",?\s*\)', src))
        codes |= set(re.findall(r'CloudError\.code else "(\w+)"', src))
        codes |= set(re.findall(r'^    code = "(\w+)"', src, re.M))  # an error class's default
        codes |= {f"Bootstrap.{s}" for s in re.findall(r'self\._step\(sh, "([\w-]+)"', src)}
    planner = (ROOT / "slurm_burst" / "core" / "reconcile.py").read_text()
    codes |= set(re.findall(r'Action\(\s*"\w+",\s*"(\w+)"', planner))
    return codes


def test_every_error_code_is_explained_in_the_runbook() -> None:
    runbook = (DOCS / "operations.md").read_text()
    codes = _codes_in_code()
    assert {"BootTimeout", "Bootstrap.wg-up", "Orphan", "DaemonDown", "HubPeer"} <= codes
    missing = sorted(c for c in codes if f"`{c}`" not in runbook)
    assert missing == [], f"error codes not in docs/operations.md: {missing}"
