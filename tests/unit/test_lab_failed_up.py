"""A failed ``lab up`` removes what it started, its state directory with it, but not its
logs: they move beside the state directory, where its error message points."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab import components as c
from slurm_burst_lab.service import Lab


class FailingLab(Lab):
    """A lab whose start fails once its logs exist, and whose removal removes the state
    directory (what ``down`` does last), without a Slurm, a network or root."""

    def __init__(self, state: Path) -> None:  # no config: only the paths are used
        self.paths = c.Paths(state)
        self.progress = lambda msg: None
        self.downs = 0

    @staticmethod
    def preflight() -> None:
        pass

    def _read_record(self) -> dict[str, Any] | None:
        return None

    def _up(self, timeout: float) -> dict[str, Any]:
        self.paths.log.mkdir(parents=True)
        (self.paths.log / "daemon.log").write_text("bind 127.0.0.1:9466: address in use\n")
        raise RuntimeError("slurm-burst daemon heartbeat: the process exited")

    def down(self) -> list[str]:
        self.downs += 1
        for p in sorted(self.paths.state.rglob("*"), reverse=True):
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink()
        self.paths.state.rmdir()
        return [str(self.paths.state)]


def test_the_logs_of_a_failed_up_outlive_its_removal(tmp_path: Path) -> None:
    lab = FailingLab(tmp_path / "slurm-burst-lab")
    kept = tmp_path / "slurm-burst-lab-failed-up-logs"
    kept.mkdir()
    (kept / "old.log").write_text("an earlier failed up's\n")
    with pytest.raises(RuntimeError, match="heartbeat"):
        lab.up(timeout=1)
    assert lab.downs == 1 and not lab.paths.state.exists()
    assert lab.paths.failed_up_logs == kept
    assert sorted(p.name for p in kept.iterdir()) == ["daemon.log"]  # the last failure's
    assert "address in use" in (kept / "daemon.log").read_text()


@pytest.mark.parametrize("there", ["link", "fifo"])
def test_what_is_in_the_place_of_the_kept_logs_is_replaced_not_followed(
    tmp_path: Path, there: str
) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.me").write_text("not the lab's\n")
    lab = FailingLab(tmp_path / "slurm-burst-lab")
    if there == "link":
        lab.paths.failed_up_logs.symlink_to(target)
    else:
        os.mkfifo(lab.paths.failed_up_logs)
    with pytest.raises(RuntimeError):
        lab.up(timeout=1)
    assert lab.downs == 1 and not lab.paths.state.exists()
    assert not lab.paths.failed_up_logs.is_symlink()
    assert (lab.paths.failed_up_logs / "daemon.log").is_file()
    assert (target / "keep.me").read_text() == "not the lab's\n"


def test_a_process_that_exits_while_awaited_is_named_with_the_last_line_it_wrote(
    tmp_path: Path,
) -> None:
    out = tmp_path / "daemon.out"
    out.write_text("starting\nerror: bind 127.0.0.1:9466: Address already in use\n\n")
    pid = 2**22 + 7  # above pid_max's default: no such process
    with pytest.raises(RuntimeError) as exc:
        c.wait_for(lambda: False, 5, "slurm-burst daemon heartbeat", c.Proc(pid, 1, str(out)))
    assert str(exc.value) == (
        "slurm-burst daemon heartbeat: the process exited; "
        "it wrote last: error: bind 127.0.0.1:9466: Address already in use"
    )
    for output in (str(tmp_path / "none.out"), ""):  # no file; a Proc from an older record
        with pytest.raises(RuntimeError, match=r"the process exited$"):
            c.wait_for(lambda: False, 5, "munged socket", c.Proc(pid, 1, output))


def test_the_last_line_of_a_log_is_read_safely(tmp_path: Path) -> None:
    big = tmp_path / "big.out"
    big.write_bytes(b"x" * 100_000 + b"\n\xff\xfe " + b"y" * 1000 + b"\n")
    assert c.last_line(big) == "\ufffd\ufffd " + "y" * 396 + "…"
    fifo = tmp_path / "fifo.out"
    os.mkfifo(fifo)
    assert c.last_line(fifo) == ""  # returns at once, nothing read
    link = tmp_path / "link.out"
    link.symlink_to(big)
    assert c.last_line(link) == ""
