"""The file rules every reader of a config, credentials or resume file shares: the
StrictModes rule (``untrusted``), regular files under a cap (``read_regular``) and
writes that cannot be redirected (``write_atomic``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_burst.fileio import FileRefused, read_regular, untrusted, write_atomic

NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    """A directory only we can write, holding one file."""
    tmp_path.chmod(0o755)
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    (d / "cfg.toml").write_text("x = 1\n")
    (d / "cfg.toml").chmod(0o640)
    return d


def test_our_own_file_in_our_own_directories_is_trusted(home: Path) -> None:
    assert untrusted(home / "cfg.toml") is None


@needs_root
def test_a_file_or_a_directory_above_it_owned_by_another_user_is_not(home: Path) -> None:
    os.chown(home / "cfg.toml", NOBODY, -1)
    assert "is owned by" in (untrusted(home / "cfg.toml") or "")
    os.chown(home / "cfg.toml", 0, -1)
    os.chown(home, NOBODY, -1)
    why = untrusted(home / "cfg.toml") or ""
    assert f"{home} is owned by" in why and "not by root" in why


@pytest.mark.parametrize(("where", "mode", "who"), [
    ("file", 0o646, "anyone"), ("file", 0o660, "its group"),
    ("dir", 0o777, "anyone"), ("dir", 0o775, "its group"),
])  # fmt: skip
def test_writable_by_others_is_not_trusted(home: Path, where: str, mode: int, who: str) -> None:
    path = home / "cfg.toml" if where == "file" else home
    os.chown(path, -1, NOBODY)  # a group that is not root's
    path.chmod(mode)
    why = untrusted(home / "cfg.toml") or ""
    assert f"{path} is writable by {who}" in why and f"{mode:04o}" in why


@needs_root
def test_a_group_writable_path_of_roots_group_is_trusted(home: Path) -> None:
    os.chown(home, -1, 0)
    home.chmod(0o775)
    assert untrusted(home / "cfg.toml") is None


def test_a_sticky_directory_of_roots_above_is_fine_but_not_without_the_sticky_bit(
    home: Path,
) -> None:
    if home.parent.stat().st_uid != 0:
        pytest.skip("the sticky directory must be root's")
    home.parent.chmod(0o1777)
    assert untrusted(home / "cfg.toml") is None
    home.parent.chmod(0o777)
    assert "writable by anyone" in (untrusted(home / "cfg.toml") or "")


def test_a_symlink_is_judged_by_where_it_leads(home: Path, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "real.toml").write_text("x = 1\n")
    (home / "link.toml").symlink_to(open_dir / "real.toml")
    assert f"{open_dir} is writable by anyone" in (untrusted(home / "link.toml") or "")


def test_a_missing_file_says_so(home: Path) -> None:
    assert "No such file" in (untrusted(home / "nope.toml") or "")


def test_read_regular_refuses_fifos_directories_and_oversized_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="not a regular file"):
        read_regular(tmp_path / "fifo", 100)  # and does not hang
    with pytest.raises(FileRefused, match="not a regular file"):
        read_regular(tmp_path, 100)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(FileRefused, match="101 bytes, over the limit of 100"):
        read_regular(tmp_path / "big", 100)
    assert read_regular(tmp_path / "big", 101) == b"x" * 101


def test_write_atomic_never_writes_through_a_planted_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out.csv.tmp").symlink_to(victim)
    (tmp_path / ".out.csv.tmp").symlink_to(victim)
    with write_atomic(tmp_path / "out.csv", mode=0o600) as fh:
        fh.write("a,b\n")
    assert victim.read_text() == "precious"
    assert (tmp_path / "out.csv").read_text() == "a,b\n"
    assert (tmp_path / "out.csv").stat().st_mode & 0o777 == 0o600
    with pytest.raises(RuntimeError), write_atomic(tmp_path / "out.csv") as fh:
        fh.write("half")
        raise RuntimeError("the export fails half-way")
    assert (tmp_path / "out.csv").read_text() == "a,b\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".out.csv.tmp", "out.csv", "out.csv.tmp", "victim",
    ]  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a directory another group: needs root")
def test_a_directory_writable_by_slurm_users_group_is_checked_against_that_group(
    tmp_path: Path,
) -> None:
    """The ledger lives in the state directory, 0770 in SlurmUser's group (the Ansible
    role's and the unit's): with no group named it is accepted; with a group named, only
    that group (or root's) may write; nobody else, ever. The mode is never changed."""
    from slurm_burst.fileio import ensure_dir

    d = tmp_path / "state"
    d.mkdir()
    os.chown(d, 0, 65534)
    d.chmod(0o770)
    assert ensure_dir(d, 0o750) is False
    assert ensure_dir(d, 0o770, 65534) is False
    with pytest.raises(FileRefused, match="writable by group 65534"):
        ensure_dir(d, 0o770, 12345)
    d.chmod(0o1777)
    with pytest.raises(FileRefused, match="writable by anyone"):
        ensure_dir(d, 0o750)
    assert stat.S_IMODE(d.stat().st_mode) == 0o1777
