"""What `make test`'s pytest runs ended with, printed last: one line a run (its totals
and wall time), one a test that failed or errored (its id and the first line of its
message), then the slowest tests of all runs and the whole wall time.

`make test` runs pytest once on the host's Slurm and, as root, once on each other lab
release; each writes a JUnit XML report into one directory, and this reads them all. A
CI log that keeps only its tail then still names every failure, whichever run it was in.

    python scripts/test-recap.py .make/test-results

Exits 0; the runs' own exit codes decide `make test`'s.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path

MESSAGE_CHARS = 300
SLOWEST = 25
# a traceback entry's location line in pytest's report ("tests/lab/test_x.py:112: in f"
# or "...:112: TimeoutError"); ours are the project's own files, not an installed library's
FRAME = re.compile(r"^((?:tests|lab|slurm_burst|scripts|benchmarks)/[^\s:]+\.py):(\d+):", re.M)


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


def raised_at(trace: str | None) -> str:
    """Where a failure was raised, from its traceback: the deepest frame in a test module
    (``test_*.py``: the line that waited, not the shared ``wait`` helper), else the
    deepest of the project's own ("" if none). CI's tail then says where alone."""
    frames = FRAME.findall(trace or "")
    tests = [f for f in frames if f[0].rpartition("/")[2].startswith("test_")]
    where = (tests or frames)[-1:]  # a test module's line before a shared helper's
    return f"{where[0][0]}:{where[0][1]}" if where else ""


def load(report: Path) -> ET.Element | str:
    """The report's root element, or why it could not be read."""
    try:
        return ET.parse(report).getroot()  # noqa: S314 - our own pytest runs wrote it
    except (OSError, ET.ParseError) as exc:
        return str(exc)


def suites(root: ET.Element) -> list[ET.Element]:
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def recap(name: str, root: ET.Element | str) -> list[str]:
    """The run's totals line, then a line per failed or errored test case."""
    if isinstance(root, str):
        return [f"{name}: no report ({root})"]
    runs = suites(root)
    totals = {k: sum(int(s.get(k, "0")) for s in runs)
              for k in ("tests", "failures", "errors", "skipped")}  # fmt: skip
    seconds = sum(float(s.get("time", "0")) for s in runs)
    lines = [
        f"{name}: {totals['tests']} tests, {totals['failures']} failed, "
        f"{totals['errors']} errors, {totals['skipped']} skipped "
        f"in {seconds:.0f} s ({seconds / 60:.1f} min)"
    ]
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            for what in case.findall(kind):
                test = f"{case.get('classname', '')}::{case.get('name', '')}"
                said = first_line(what.get("message")) or first_line(what.text)
                where = raised_at(what.text)
                said += f" (at {where})" if where else ""
                lines.append(f"  {kind.upper()} {test}: {said}")
    return lines


def span(roots: list[ET.Element]) -> tuple[float, float]:
    """The runs' seconds added up, and from the first one's start to the last one's end
    (less than the sum where runs went side by side); pytest's suites carry their start
    (``timestamp``) and their wall time."""
    total, starts, ends = 0.0, [], []
    for suite in (s for root in roots for s in suites(root)):
        seconds = float(suite.get("time", "0"))
        total += seconds
        try:
            start = datetime.fromisoformat(suite.get("timestamp", "")).timestamp()
        except ValueError:
            continue
        starts.append(start)
        ends.append(start + seconds)
    return total, (max(ends) - min(starts)) if starts else total


def slowest(runs: list[tuple[str, ET.Element]], n: int = SLOWEST) -> list[str]:
    """The ``n`` slowest test cases of all the runs, each with its run: a test's time is
    its setup, call and teardown together (pytest's JUnit default), so a fixture's first
    user carries the fixture."""
    cases: list[tuple[float, str]] = []
    for name, root in runs:
        for case in root.iter("testcase"):
            try:
                seconds = float(case.get("time", "0"))
            except ValueError:
                continue
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((seconds, f"{name}  {test}"))
    cases.sort(reverse=True)
    return [f"{seconds:7.1f} s  {what}" for seconds, what in cases[:n]]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: test-recap.py DIR", file=sys.stderr)
        return 2
    reports = sorted(Path(argv[1]).glob("*.xml"), key=lambda p: p.stat().st_mtime)
    loaded = [(report.stem, load(report)) for report in reports]
    read = [(name, root) for name, root in loaded if not isinstance(root, str)]
    if reports:
        print(f"== the {SLOWEST} slowest tests (setup, call and teardown)")
        print("\n".join(slowest(read)))
    print("== what each test run ended with")
    for name, root in loaded:
        print("\n".join(recap(name, root)))
    if not reports:
        print("no test reports were written")
    total, wall = span([root for _, root in read])
    print(f"== the runs took {wall / 60:.1f} min from the first's start to the last's end "
          f"({total / 60:.1f} min added up; set-up not counted)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
