"""Hostile and careless input to the CLI: a clear message and a documented exit code,
never a traceback, and nothing changed. Each case is an example of a class closed at its
cause (file reading, number parsing, date ranges, output paths, schema revisions)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_burst.config import Config
from tests.conftest import invoke, lab_config_in


@pytest.fixture()
def cfg(tmp_path: Path) -> Config:
    c = lab_config_in(tmp_path)
    invoke(["--config", c.source, "db", "upgrade"])
    return c


def _sb(cfg: Config, *args: str, expect: int) -> str:
    r = invoke(["--config", cfg.source, *args], expect=expect)
    out = r.stdout + r.stderr
    assert "Traceback" not in out
    return out


def test_a_config_that_is_not_utf8_or_not_a_file_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe[cluster]\n")
    out = invoke(["--config", str(bad), "config", "check"], expect=2).stderr
    assert "not UTF-8" in out
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # reading a FIFO would hang for ever
    out = invoke(["--config", str(fifo), "config", "check"], expect=2).stderr
    assert "not a regular file" in out
    big = tmp_path / "big.toml"
    with big.open("wb") as fh:
        fh.truncate(2 * 1024 * 1024)
    assert "over the limit" in invoke(["--config", str(big), "config", "check"], expect=2).stderr


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (("heartbeat_stale = 60", "heartbeat_stale = nan"), "must be a finite number"),
        (("poll_period = 5 ", "poll_period = inf "), "must be a finite number"),
        (('"ns.cpu2" = 0.085', '"ns.cpu2" = 1e308'), "too large an amount"),
        (("price_per_hour = 1.40", "price_per_hour = nan"), "must be a finite number"),
        (("count = 32", "count = 10000000"), "must be between 1 and 65,536"),
    ],
    ids=["nan-stale", "inf-poll", "huge-price", "nan-rate", "huge-count"],
)
def test_numbers_that_mean_nothing_are_config_errors(
    tmp_path: Path, edit: tuple[str, str], fragment: str
) -> None:
    cfg = lab_config_in(tmp_path)
    text = Path(cfg.source).read_text()
    assert edit[0] in text, edit
    Path(cfg.source).write_text(text.replace(edit[0], edit[1]))
    r = invoke(["--config", cfg.source, "config", "check"], expect=2)
    out = r.stdout + r.stderr
    assert fragment in out


def test_budget_amounts_out_of_range_change_nothing(cfg: Config) -> None:
    for amount, fragment in (
        ("1e308", "too large"),
        ("nan", "not an amount"),
        ("0.0000001", "less than one micro-dollar"),
        ("-5", "cannot be negative"),
    ):
        args = ["budget", "set", "--no-sync", "--", "physics", amount]  # -5 is not an option
        assert fragment in _sb(cfg, *args, expect=2)
    assert "physics" not in _sb(cfg, "budget", "show", "--json", expect=0)


def test_dates_at_the_end_of_the_calendar_are_bad_input(cfg: Config) -> None:
    assert "before 9999-12-31" in _sb(cfg, "ledger", "report", "--to", "9999-12-31", expect=2)
    assert "YYYY-MM-DD" in _sb(cfg, "ledger", "report", "--from", "2026-13-01", expect=2)


def test_an_export_to_a_missing_directory_is_bad_input(cfg: Config, tmp_path: Path) -> None:
    out = _sb(cfg, "ledger", "export", "-o", str(tmp_path / "no" / "x.csv"), expect=2)
    assert "cannot write" in out


def test_an_export_never_writes_through_or_over_a_planted_symlink(
    cfg: Config, tmp_path: Path
) -> None:
    """Another user plants ``out.csv`` (or its old temporary name) as a symlink to a file
    root may write: the export refuses it, naming it, and changes nothing; a new name
    is written whole, 0640, despite the planted temporary name."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out.csv"
    (tmp_path / "new.csv.tmp").symlink_to(victim)
    out.symlink_to(victim)
    err = _sb(cfg, "ledger", "export", "-o", str(out), expect=2)
    assert "symbolic link" in err and str(out) in err
    assert victim.read_text() == "precious\n" and out.is_symlink()
    new = tmp_path / "new.csv"
    _sb(cfg, "ledger", "export", "-o", str(new), expect=0)
    assert victim.read_text() == "precious\n"
    assert new.read_text().startswith("day,account,")
    assert oct(new.stat().st_mode & 0o777) == "0o640"


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a device node: needs root")
@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_an_export_onto_a_device_or_fifo_leaves_it_as_it_is(
    cfg: Config, tmp_path: Path, kind: str
) -> None:
    """``-o`` naming a device (a copy of /dev/null made here) or a FIFO: refused, and
    the node is still a device (it was replaced by a regular file before)."""
    target = tmp_path / kind
    if kind == "device":
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        os.mkfifo(target)
    before = os.lstat(target)
    err = _sb(cfg, "ledger", "export", "-o", str(target), expect=2)
    assert "regular file" in err
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        before.st_mode, before.st_ino, before.st_rdev,
    )  # fmt: skip


def test_an_unknown_schema_revision_is_bad_input(cfg: Config) -> None:
    assert "no schema revision 'bogus'" in _sb(cfg, "db", "upgrade", "--to", "bogus", expect=2)
    assert "known: head, 0001, 0002" in _sb(cfg, "db", "upgrade", "--to", "", expect=2)


def test_config_show_prints_any_valid_config(cfg: Config) -> None:
    out = _sb(cfg, "config", "show", "--json", expect=0)
    assert '"price_per_hour"' in out and '"ns.cpu2": 0.085' in out


def test_host_numbers_past_the_int_limit_are_hostlist_errors() -> None:
    huge = "9" * 5000
    for args in (["hostlist", "expand", f"a[1-{huge}]"], ["hostlist", "compress", f"a{huge}"]):
        r = invoke(args, expect=2)
        assert "Traceback" not in r.stderr and "digits" in r.stderr and len(r.stderr) < 400


def test_a_budget_for_an_account_slurm_does_not_know_is_refused(tmp_path: Path) -> None:
    """A typo would budget nobody: Slurm (its accounting database, here a stand-in
    sacctmgr that knows physics) is asked first; --force records it anyway."""
    cfg = lab_config_in(tmp_path)
    bin_dir = Path(cfg.slurm.bin_dir)  # the lab config's, under tmp_path
    bin_dir.mkdir(parents=True)
    sacctmgr = bin_dir / "sacctmgr"
    sacctmgr.write_text(
        '#!/bin/sh\ncase "$*" in *"show association"*"account=physics "*) echo physics;; '
        '*"show association"*) ;; *) exit 0;; esac\n'
    )
    sacctmgr.chmod(0o755)
    invoke(["--config", cfg.source, "db", "upgrade"])
    out = _sb(cfg, "budget", "set", "--no-sync", "phyiscs", "100", expect=2)
    assert "Slurm has no account 'phyiscs' on cluster burstlab" in out and "--force" in out
    _sb(cfg, "budget", "set", "--no-sync", "physics", "100", expect=0)
    _sb(cfg, "budget", "set", "--no-sync", "--force", "newdept", "50", expect=0)
    shown = _sb(cfg, "budget", "show", "--json", expect=0)
    assert "physics" in shown and "newdept" in shown and "phyiscs" not in shown
    sacctmgr.write_text("#!/bin/sh\necho 'slurmdbd: connection refused' >&2\nexit 1\n")
    out = _sb(cfg, "budget", "set", "--no-sync", "physics", "100", expect=1)
    assert "cannot ask Slurm whether account 'physics' exists" in out


# -- the second hardening round: one regression test per case it found ----------------


def test_a_config_nested_5000_levels_deep_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    path.chmod(0o640)
    err = invoke(["--config", str(path), "config", "check"], expect=2).stderr
    assert "nested more than 10 levels" in err and "Traceback" not in err


def test_conf_render_refuses_a_config_that_would_inject_a_line(tmp_path: Path) -> None:
    """The newline at the end of a partition name reached slurm.conf as a SlurmUser= line
    and `config check` said OK; now both refuse it, naming the key and line."""
    lab_config_in(tmp_path)  # the lab's config under tmp_path, then the planted newline
    path = tmp_path / "slurm-burst.toml"
    path.write_text(
        path.read_text().replace(
            'partition = "burst-cpu"', 'partition = "burst-cpu\\nSlurmUser=root"'
        )
    )
    out = tmp_path / "etc"
    args = ["--config", str(path), "conf", "render", "--slurm-release", "24.11", "-o", str(out)]
    err = invoke(args, expect=2).stderr
    assert "node_groups.cpu.partition" in err and "\\n" in err and "\nSlurmUser" not in err
    assert not out.exists()
    check = invoke(["--config", str(path), "config", "check"], expect=2).stderr
    assert "slurm-burst.toml:" in check and "node_groups.cpu.partition" in check


def test_superscript_digits_in_a_duration_are_bad_input(cfg: Config) -> None:
    from slurm_burst.wiring.light import node_store

    node_store(cfg).close()  # the daemon's state database, as on a running site
    out = _sb(cfg, "group", "warm", "ec2", "--nodes", "1", "--for", "²m", expect=2)
    assert "--for '²m'" in out


def test_an_account_with_a_trailing_newline_is_refused_even_with_force(cfg: Config) -> None:
    out = _sb(cfg, "budget", "set", "physics\n", "100", "--force", "--no-sync", expect=2)
    assert "is not a Slurm account name" in out
    assert "physics\n" not in _sb(cfg, "budget", "show", "--json", expect=0)


def test_a_gzip_trace_of_blank_lines_is_refused_without_reading_it_into_memory(
    cfg: Config, tmp_path: Path
) -> None:
    """25 million blank lines compress to ~25 KB; the old reader decompressed them all
    and split them (MemoryError on a 1 GiB one). Now the line cap stops it."""
    import gzip

    bomb = tmp_path / "blank.swf.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        chunk = b"\n" * (1 << 20)
        for _ in range(25):
            fh.write(chunk)
    assert bomb.stat().st_size < 1 << 20
    out = _sb(cfg, "simulate", "--trace", str(bomb), "--format", "swf", "--cpus", "64", expect=2)
    assert "over 20,000,000 lines" in out


@pytest.mark.parametrize("command", ["transfers", "storage"])
def test_an_account_that_is_not_utf8_is_bad_input_from_a_real_shell(
    cfg: Config, command: str
) -> None:
    """The installed program, its argv bytes as a shell passes them: a byte that is not
    UTF-8 reached the ledger's query and ended in a traceback."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("slurm-burst")
    args: list[str | bytes | Path] = [
        exe, b"--config", cfg.source, b"ledger", command.encode(), b"--account", b"phys\xffics"
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, timeout=60, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and b"Traceback" not in out, out
    assert b"is not a Slurm account name" in out and b"\xff" not in out, out
    ok = subprocess.run([*args[:-1], b"PHYSICS"], capture_output=True, timeout=60, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr  # a name in any case is taken


def test_numbers_in_other_scripts_are_bad_input_on_the_new_commands(cfg: Config) -> None:
    for args in (
        ("stage", "gc", "--keep-days", "٣"),
        ("stage", "outputs", "--job", "1_0"),
        ("ledger", "transfers", "--job", "\uff11"),  # fullwidth 1
        ("policy", "tune", "--target", "0.9\n"),
    ):
        out = _sb(cfg, *args, expect=2)
        assert "ASCII" in out, (args, out)
