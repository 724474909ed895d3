"""scripts/test-recap.py: what make test prints last (each run, each failure, the slowest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import script

recap = script("test-recap")

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0"
 failures="1" skipped="0" tests="3" time="{total}" timestamp="{start}">
<testcase classname="tests.lab.test_a" name="test_slow" time="120.5"/>
<testcase classname="tests.lab.test_a" name="test_quick" time="0.2"/>
<testcase classname="tests.unit.test_b" name="test_broken" time="{broken}">
<failure message="assert 1 == 2&#10;second line">def test_broken():
&gt;       helper()

tests/unit/test_b.py:9:
_ _ _
/usr/lib/python3/dist-packages/paramiko/client.py:40: in connect
tests/lab/test_x.py:31: in boot
tests/conftest.py:77: in helper
    assert 1 == 2
E   assert 1 == 2

tests/conftest.py:78: AssertionError</failure></testcase>
</testsuite></testsuites>"""


def write(tmp_path: Path, name: str, total: float, broken: float, start: str) -> Path:
    path = tmp_path / f"{name}.xml"
    path.write_text(REPORT.format(total=total, broken=broken, start=start))
    return path


def test_each_run_its_failures_the_slowest_and_the_whole_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "host", 600, 3.0, "2026-11-28T12:00:00+00:00")
    write(tmp_path, "lab-26.05", 300, 400.0, "2026-11-28T12:08:00+00:00")  # beside the host's
    (tmp_path / "broken.xml").write_text("<testsuites")  # a run that died mid-write
    assert recap.main(["test-recap.py", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "host: 3 tests, 1 failed, 0 errors, 0 skipped in 600 s (10.0 min)" in out
    assert ("FAILURE tests.unit.test_b::test_broken: assert 1 == 2 (at tests/lab/test_x.py:31)"
            in out)  # fmt: skip
    assert "broken: no report" in out
    slow = out.split("teardown)\n")[1].split("==")[0].rstrip().splitlines()
    assert slow[0] == "  400.0 s  lab-26.05  tests.unit.test_b::test_broken"
    assert {line.split("s  ", 1)[1] for line in slow[1:3]} == {
        "lab-26.05  tests.lab.test_a::test_slow", "host  tests.lab.test_a::test_slow"}  # fmt: skip
    assert len(slow) == 6
    assert out.rstrip().endswith(
        "the runs took 13.0 min from the first's start to the last's end "
        "(15.0 min added up; set-up not counted)"
    )


def test_no_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert recap.main(["test-recap.py", str(tmp_path)]) == 0
    assert "no test reports were written" in capsys.readouterr().out
