"""Every command, fed what an attacker or a careless hand would: generated arguments and
option values (garbage, huge numbers, NaN, dates at the calendar's end) and files (a
FIFO, a symlink, an empty, a huge, a non-UTF-8 one). Whatever comes in: no traceback
reaches the user, the exit code is a documented one, and a hook either records its
request or exits 2 having recorded nothing.

Slurm is faked by small programs in the config's ``slurm.bin_dir`` (recorded 22.05 output;
``scontrol update`` accepts), the ledger is SQLite; no cloud is called by these commands.
``lab`` and ``daemon`` are left out (they start processes), and ``events --follow`` (it
never ends by design).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_burst.cli.main import cli
from slurm_burst.config import Config
from slurm_burst.services.hooks import HOOK_EXIT_CODES
from tests.conftest import ROOT, examples, lab_config_in

DOCUMENTED = {0, 1, 2, 3}
SKIP = {("lab",), ("daemon",)}
DATA = ROOT / "tests" / "data" / "slurm-22.05"

FAKE_SLURM = {
    "sinfo": f'cat "{DATA / "sinfo.json"}"',
    "squeue": f'case "$*" in *--json*) cat "{DATA / "squeue.json"}";; *) :;; esac',
    "scontrol": (
        'case "$1" in ping) echo "Slurmctld(primary) at ctl is UP";; '
        f'show) cat "{DATA / "partitions.txt"}";; *) :;; esac'
    ),
    "sacct": 'echo \'{"meta": {}, "errors": [], "jobs": []}\'',
    "sacctmgr": ":",
}


def _fake_slurm(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True)
    for tool, body in FAKE_SLURM.items():
        path = bin_dir / tool
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, Path]]:
    """The lab's config under a temporary directory, Slurm faked, the ledger created,
    the daemon's heartbeat fresh; and a directory of hostile files."""
    tmp = tmp_path_factory.mktemp("cli-property")
    cfg = lab_config_in(tmp)
    bin_dir = Path(cfg.slurm.bin_dir)  # the lab config's, under tmp
    _fake_slurm(bin_dir)
    files = tmp / "files"
    files.mkdir()
    (files / "empty").write_bytes(b"")
    (files / "garbage").write_bytes(b"\xff\xfe\x00garbage\x80" * 10)
    with (files / "huge").open("wb") as fh:
        fh.truncate(20 * 1024 * 1024)
    os.mkfifo(files / "fifo")
    (files / "link").symlink_to("/etc/passwd")
    (files / "dangling").symlink_to(files / "nowhere")
    (files / "dir").mkdir()
    (tmp / "victim").write_text("precious\n")
    (files / "victim-link").symlink_to(tmp / "victim")  # planted where a command writes
    if os.geteuid() == 0:  # a device node, as /dev/null: a command must not replace it
        os.mknod(files / "device", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        (files / "device").symlink_to("/dev/null")
    runner = CliRunner()
    assert runner.invoke(cli, ["--config", cfg.source, "db", "upgrade"]).exit_code == 0
    from slurm_burst.wiring.light import node_store

    store = node_store(_load(cfg.source))
    store.beat(time.time() + 10**6, {"pid": 1, "node_id": "prop"})  # fresh for the run
    store.close()
    yield _load(cfg.source), files
    shutil.rmtree(tmp, ignore_errors=True)


def _load(path: str) -> Config:
    from slurm_burst.config import load_config

    return load_config(Path(path))


def _commands() -> list[tuple[tuple[str, ...], click.Command]]:
    out = []

    def walk(cmd: click.Command, path: tuple[str, ...], ctx: click.Context) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and (*path, name)[:1] not in {p[:1] for p in SKIP}:
                    walk(sub, (*path, name), click.Context(sub, info_name=name, parent=ctx))
        else:
            out.append((path, cmd))

    walk(cli, (), click.Context(cli, info_name="slurm-burst"))
    return out


COMMANDS = _commands()

HOSTILE = st.sampled_from(
    [
        "", "nan", "inf", "-inf", "-1", "0", "1e308", "0.0000001", "9" * 5000,
        "9999-12-31", "0000-00-00", "2026-02-30", "burst-cpu-[1-3]", "burst-cpu-[3-1]",
        "burst-cpu-[1-" + "9" * 30 + "]", "x" * 300, "$(touch /tmp/pwned)", "a,b,,c",
        "--", "-", "physics", "cpu", "gpu", "month", "account,job", "json", "bogus",
        "burst-gpu-1", "onprem-1", "'quoted' \"both\"", "é\u202e", "head", "0001",
        # control characters and other scripts' digits (hardening round two)
        "burst-cpu-1\n", "physics\n", "physics\nSlurmUser=root", "x\x00y", "\x1b[31mred",
        "a\u2028b", "¹²", "٣", "²m", "1\r", "burst-cpu-[1-2]\t", "\u0085",
        # round three: underscores, signs, surrogate-escaped bytes, case (HIPAA)
        "1_0", "+5", "0.5\n", "phys\udcffics", "\udcff", "HIPAA", "Physics",
    ]
)  # fmt: skip
FILES = st.sampled_from(
    ["empty", "garbage", "huge", "fifo", "link", "dangling", "dir", "new", "victim-link", "device"]
)


@st.composite
def argv(draw: st.DrawFn, cmd: click.Command, files: Path, out_dir: Path) -> list[str]:
    """Some of ``cmd``'s options with hostile values, then hostile positional arguments."""
    args: list[str] = []
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.name == "follow" or not draw(st.booleans()):
            continue
        flag = max(p.opts, key=len)
        if p.is_flag:
            args.append(flag)
        elif isinstance(p.type, click.Path) or p.name in ("output", "output_dir", "hook_dir"):
            name = draw(FILES)
            args += [flag, str(out_dir / "out.csv" if name == "new" else files / name)]
        elif isinstance(p.type, click.Choice) and draw(st.booleans()):
            args += [flag, draw(st.sampled_from([str(c) for c in p.type.choices]))]
        else:
            args += [flag, draw(HOSTILE)]
    positional = [p for p in cmd.params if isinstance(p, click.Argument)]
    if positional:
        args.append("--")
        for p in positional:
            n = draw(st.integers(0, 3)) if p.nargs == -1 else 1
            args += [
                draw(st.one_of(HOSTILE, FILES.map(lambda f: str(files / f)))) for _ in range(n)
            ]
    return args


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_input_makes_a_command_crash(
    world: tuple[Config, Path],
    tmp_path: Path,
    path: tuple[str, ...],
    cmd: click.Command,
    data: st.DataObject,
) -> None:
    cfg, files = world
    args = data.draw(argv(cmd, files, tmp_path))
    device = os.lstat(files / "device")
    passwd = os.stat("/etc/passwd")
    before = _requests(cfg)
    with tempfile.TemporaryDirectory(dir=tmp_path) as cwd, contextlib.chdir(cwd):
        result = CliRunner().invoke(
            cli, ["--config", cfg.source, *path, *args]
        )  # relative paths land in cwd
    shown = f"{' '.join(path)} {args!r}: exit {result.exit_code}\n{result.output[-2000:]}"
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, f"traceback for {shown}\n{result.exception!r}"
    assert "Traceback" not in result.output, shown
    hook = path[0] in ("resume", "suspend", "resume-fail")
    assert result.exit_code in (set(HOOK_EXIT_CODES) if hook else DOCUMENTED), shown
    # nothing written through a planted link or over a device, whatever the exit
    assert (files.parent / "victim").read_text() == "precious\n", shown
    after = os.lstat(files / "device")
    assert (after.st_mode, after.st_ino, after.st_rdev) == (
        device.st_mode, device.st_ino, device.st_rdev,
    ), shown  # fmt: skip
    assert os.stat("/etc/passwd").st_mtime_ns == passwd.st_mtime_ns, shown
    if path[0] in ("resume", "suspend", "resume-fail"):
        added = _requests(cfg) - before
        if result.exit_code == 2:
            assert added == 0, f"exit 2 but a request was recorded: {shown}"
        elif result.exit_code == 0:
            assert added == 1, f"exit 0 but {added} requests recorded: {shown}"


def _requests(cfg: Config) -> int:
    from slurm_burst.wiring.light import node_store

    store = node_store(cfg)
    try:
        return len(store.pending_requests())
    finally:
        store.close()
