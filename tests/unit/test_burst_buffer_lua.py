"""The rendered burst_buffer.lua, run by a real Lua 5.1 (Slurm's) outside slurmctld:
its submit checks agree with the daemon's parser, its paths and its data_in."""

from __future__ import annotations

import random
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from slurm_burst.config import Config, load_config
from slurm_burst.core.staging import StagingError, parse_stages
from slurm_burst.services.burstbuffer import lua_string
from slurm_burst.services.slurmconf import render
from tests.unit.test_config import GOOD, write

LUA = shutil.which("lua5.1")
HARNESS = Path(__file__).resolve().parents[1] / "lua" / "harness.lua"
pytestmark = pytest.mark.skipif(
    LUA is None, reason="needs lua5.1 and lua-posix (make test installs them)"
)

STAGING = """
[stores.s3]
bucket = "bucket-1"
region = "eu-west-1"
credentials = { key_env = "K", secret_env = "S" }

[staging]
store = "s3"
onprem_only_paths = ["/srv/medical", "/data/x"]
node_dir = "/scratch/stage"

[policy.accounts.hospital]
onprem_only = true

[policy.qos.secret]
onprem_only = true
"""


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> Config:
    tmp = tmp_path_factory.mktemp("bb")
    text = GOOD.replace("[slurm]\n", f'[slurm]\nhook_dir = "{tmp}/bin"\n') + STAGING
    return load_config(write(tmp, text))


@pytest.fixture(scope="module")
def script(cfg: Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lua") / "burst_buffer.lua"
    path.write_text(render(cfg, "24.11")["burst_buffer.lua"])
    return path


def lua(script: Path, *args: str) -> list[str]:
    assert LUA is not None
    done = subprocess.run(
        [LUA, str(HARNESS), str(script), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def process(script: Path, tmp: Path, scripts: list[str], *job: str) -> list[str]:
    batch = tmp / "scripts"
    batch.write_bytes(b"".join(s.encode("utf-8", "surrogateescape") + b"\0" for s in scripts))
    return lua(script, "process", str(batch), *job)


def test_render_adds_the_burst_buffer_and_its_hook(cfg: Config) -> None:
    files = render(cfg, "24.11")
    assert "BurstBufferType=burst_buffer/lua" in files["slurm-burst.conf"].splitlines()
    conf = files["burst_buffer.conf"].splitlines()
    assert "PollInterval=1" in conf and "Directive=BB_LUA" in conf
    # 22.05 has no PollInterval (slurmctld refuses to start with it): no test_data_in
    assert "PollInterval=1" not in render(cfg, "22.05")["burst_buffer.conf"]
    table = files["burst_buffer.lua"]
    assert f'program = "{cfg.slurm.hook_dir}/slurm-burst-stage-in"' in table
    assert 'onprem_paths = { "/srv/medical", "/data/x", }' in table
    assert 'onprem_accounts = { ["hospital"] = true, }' in table


def test_without_a_store_there_is_no_burst_buffer(tmp_path: Path) -> None:
    files = render(load_config(write(tmp_path, GOOD)), "24.11")
    assert sorted(files) == ["gres.conf", "slurm-burst.conf"]
    assert "BurstBufferType" not in "".join(
        ln for ln in files["slurm-burst.conf"].splitlines() if not ln.startswith("#")
    )


def test_a_config_value_cannot_become_lua() -> None:
    assert lua_string('a"b\\c\n]]') == '"a\\034b\\092c\\010\\093\\093"'
    assert lua_string("/data/ok-1.2") == '"/data/ok-1.2"'


def test_submit_refuses_bad_directives_and_says_which_line(script: Path, tmp_path: Path) -> None:
    out = process(
        script,
        tmp_path,
        [
            "#!/bin/sh\n#BB_LUA stage_in src=/d/a dst=a\nsrun x\n",
            "#!/bin/sh\n#BB_LUA stage_in src=/d/../etc dst=a\n",
            "#!/bin/sh\n#SBATCH -N1\n#BB_LUA stage_up src=d dst=/a\n",
            "#!/bin/sh\n#BB_LUAX stage_in src=/d dst=a\n",
        ],
    )
    assert out[0] == "0"
    assert out[1].startswith("-1 slurm-burst: line 2: src=") and "normalized" in out[1]
    assert out[2] == '-1 slurm-burst: line 3: "stage_up" is not a stage slurm-burst knows ' \
        "(stage_in, stage_out)"  # fmt: skip
    assert out[3].startswith('-1 slurm-burst: line 2: "#BB_LUAX" is not #BB_LUA')


def test_submit_keeps_sensitive_data_home_for_a_burst_only_job(
    script: Path, tmp_path: Path
) -> None:
    secret = "#!/bin/sh\n#BB_LUA stage_in src=/srv/medical/scans dst=s\n"
    public = "#!/bin/sh\n#BB_LUA stage_in src=/srv/public dst=s\n"
    # 24.11 and later: the job's partitions, account and QOS come from Slurm
    near = "#!/bin/sh\n#BB_LUA stage_in src=/srv/medical2 dst=s\n"
    burst = process(script, tmp_path, [secret, public, near], "burst-gpu", "phys", "")
    assert burst[0].startswith("-1 slurm-burst: line 2: stage of /srv/medical/scans refused: ")
    assert "under /srv/medical, which stays on-prem" in burst[0]
    assert burst[1:] == ["0", "0"]  # a prefix of a name is not the directory
    assert process(script, tmp_path, [public], "burst-gpu", "HOSPITAL", "")[0].startswith(
        "-1 slurm-burst: line 2: stage of /srv/public refused: account HOSPITAL keeps"
    )
    assert "QOS secret" in process(script, tmp_path, [public], "burst-gpu", "p", "secret")[0]
    # a job that may run on-prem is not refused: it never stages (docs/staging.md)
    assert process(script, tmp_path, [secret], "batch,burst-gpu", "p", "")[0] == "0"
    # 22.05 passes no job_info: the script's own #SBATCH -p is all the hook can see
    old = process(
        script,
        tmp_path,
        ["#!/bin/sh\n#SBATCH -p burst-gpu\n#BB_LUA stage_in src=/data/x/y dst=s\n",
         "#!/bin/sh\n#SBATCH --partition=batch\n#BB_LUA stage_in src=/data/x/y dst=s\n",
         "#!/bin/sh\n#BB_LUA stage_in src=/data/x/y dst=s\n"],
    )  # fmt: skip
    assert old[0].startswith("-1 ") and "/data/x/y is under /data/x" in old[0]
    assert old[1:] == ["0", "0"]


_HEADS = ["#BB_LUA", "#BB_LUA", "#BB_LUA", "#BB_LUAX", "#SBATCH", "#", "echo", ""]
_VERBS = ["stage_in", "stage_in", "stage_in", "stage_out", "stage_out", "stage_up", ""]
_ARGS = ["src=/d/a", "src=/d/b/c", "src=/d/../a", "src=/d//a", "src=rel", "src=/d/a;b",
         "src=/", "src=/d/", "dst=a", "dst=b.v2", "dst=a", "dst=.h", "dst=a/b", "src=",
         "dst=", "x=1", "dst=" + "n" * 64, "dst=" + "n" * 65, "src=/é", "dst=é",
         "src=ckpt", "src=w", "dst=/r/%j", "dst=/r/%j/x", "dst=/r/%a", "dst=/", "dst=/r%jj",
         "sync=0", "sync=10", "sync=9", "sync=600", "sync=604800", "sync=604801", "sync=-1",
         "sync=1e3", "sync=", "sync=0600", "sync=99999999"]  # fmt: skip


def odd_line(rng: random.Random) -> str:
    """What the hardening's cost bounds read differently: a blank line inside the
    header, a long comment, a directive line straddling MAX_LINE, one of many words."""
    kind = rng.choice(["blank", "comment", "long", "words", "cr", "huge"])
    if kind == "huge":  # a header that runs past MAX_HEADER, or stops just short of it
        return "#" + "x" * rng.randint(65_400, 65_600)
    if kind == "blank":
        return ""
    if kind == "comment":
        return "#" + " word" * rng.randint(1, 3000)
    if kind == "long":
        src = "/d/" + "a" * rng.randint(8100, 8200)  # the line is about 8,192 bytes
        return f"#BB_LUA stage_in src={src} dst=x"
    if kind == "words":
        return "#BB_LUA stage_in src=/d/a dst=x" + " dst=y" * rng.randint(1, 2000)
    return "#BB_LUA stage_in src=/d/a dst=x\r"


def random_script(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.1:
            lines.append(odd_line(rng))
            continue
        if rng.random() < 0.6:  # a good line, mostly
            if rng.random() < 0.7:
                lines.append(
                    f"#BB_LUA stage_in src=/d/{rng.choice('abc')} dst={rng.choice('wxyz')}"
                )
            else:
                sync = rng.choice(["", " sync=0", " sync=60"])
                lines.append(f"#BB_LUA stage_out src={rng.choice('vw')} dst=/r/%j{sync}")
            continue
        words = [rng.choice(_HEADS), rng.choice(_VERBS)]
        words += rng.sample(_ARGS, rng.choice([0, 1, 2, 2, 2, 3]))
        sep = rng.choice([" ", "\t", "  ", " \v"])
        lines.append(rng.choice(["", " "]) * (rng.random() < 0.1) + sep.join(words).strip())
    body = "srun true\n" * rng.choice([0, 1, 8000])  # past MAX_HEADER: never read
    return "#!/bin/sh\n" + "\n".join(lines) + "\n" + body


def test_the_lua_hook_and_the_daemon_agree_on_every_script(script: Path, tmp_path: Path) -> None:
    """Whatever Lua accepts at submit the daemon accepts at stage-in, and whatever one
    refuses the other does (a difference would let in a job that fails hours later, or
    refuse one the daemon would run). 2,000 scripts of directives good and bad."""
    rng = random.Random(29)
    batch = [random_script(rng) for _ in range(2000)]
    got = process(script, tmp_path, batch)
    assert len(got) == len(batch)
    outcomes: Counter[str] = Counter()
    for s, said in zip(batch, got, strict=True):
        try:
            stages = parse_stages(s)
            outcomes[f"ok {len(stages.ins) + len(stages.outs)}"] += 1
            outcomes["with stage_out"] += bool(stages.outs)
            py_ok = True
        except StagingError:
            outcomes["refused"] += 1
            py_ok = False
        assert (said == "0") == py_ok, (s, said)
    # the batch holds scripts of each kind: refused, with no stage, with one or more
    assert outcomes["refused"] > 200 and outcomes["ok 0"] > 50
    assert outcomes["ok 1"] > 50 and outcomes["ok 2"] > 5 and outcomes["with stage_out"] > 50


def test_paths_give_the_job_its_stage_directories(script: Path, tmp_path: Path) -> None:
    job = tmp_path / "script"
    job.write_text("#!/bin/sh\n#BB_LUA stage_in src=/d/a dst=image-net.v2\n"
                   "#BB_LUA stage_in src=/d/b dst=b\n"
                   "#BB_LUA stage_out src=ckpt dst=/r/%j sync=600\n")  # fmt: skip
    env = tmp_path / "env"
    env.write_text("")
    assert lua(script, "paths", "42", str(job), str(env)) == ["0"]
    assert env.read_text().splitlines() == [
        "SLURM_BURST_STAGE=/scratch/stage/42",
        "SLURM_BURST_STAGE_IMAGE_NET_V2=/scratch/stage/42/image-net.v2",
        "SLURM_BURST_STAGE_B=/scratch/stage/42/b",
        "SLURM_BURST_STAGE_CKPT=/scratch/stage/42/ckpt",
    ]


def test_an_array_tasks_paths_read_the_arrays_script(script: Path, tmp_path: Path) -> None:
    """From 24.11 Slurm hands an array task's hooks a path under the task's own id, but
    keeps the script under the array's: paths reads that one (job_info.array_job_id)."""
    kept = tmp_path / "state" / "hash.7" / "job.17" / "script"
    kept.parent.mkdir(parents=True)
    kept.write_text("#!/bin/sh\n#BB_LUA stage_in src=/d/a dst=x\n")
    given = tmp_path / "state" / "hash.9" / "job.19" / "script"  # task 19 of array 17
    given.parent.parent.mkdir()  # Slurm makes hash.N; job.19 it never makes
    env = given.parent / "path"
    assert lua(script, "paths", "19", str(given), str(env), "17") == ["0"]
    assert env.parent.stat().st_mode & 0o777 == 0o700
    assert env.read_text().splitlines() == [
        "SLURM_BURST_STAGE=/scratch/stage/19",
        "SLURM_BURST_STAGE_X=/scratch/stage/19/x",
    ]
    # not an array task, or a path of another shape: nothing else is read
    nowhere = tmp_path / "elsewhere" / "path"  # not Slurm's shape: no directory is made
    assert lua(script, "paths", "19", str(given), str(nowhere), "17") == ["0"]
    assert not nowhere.parent.exists()
    for args in (("19", str(given), str(env), "0"), ("19", str(tmp_path / "x"), str(env), "17")):
        assert lua(script, "paths", *args) == ["0"]
        assert env.read_text().splitlines() == ["SLURM_BURST_STAGE=/scratch/stage/19"]


def test_data_in_runs_the_program_without_a_shell_and_returns_what_it_says(
    cfg: Config, script: Path, tmp_path: Path
) -> None:
    program = Path(cfg.slurm.hook_dir) / "slurm-burst-stage-in"
    program.parent.mkdir(exist_ok=True)
    record = tmp_path / "argv"
    program.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {record}\n'
        'case "$1" in 7) echo "stage of /d/a refused: QOS q keeps its data on-prem"; exit 1;;\n'
        "esac\n"
    )
    program.chmod(0o755)
    odd = tmp_path / "job script; rm -rf x"  # a path that a shell would split
    assert lua(script, "data_in", "42", str(odd)) == ["0"]
    assert record.read_text().splitlines() == ["42", str(odd)]
    said = lua(script, "data_in", "7", "/x")
    assert said == ["-1 slurm-burst: stage of /d/a refused: QOS q keeps its data on-prem"]
    program.unlink()
    assert lua(script, "data_in", "8", "/x")[0] == "-1 slurm-burst: stage-in program exited 127"
    for hook in ("slurm_bb_pools", "slurm_bb_test_data_in", "slurm_bb_job_teardown"):
        assert lua(script, "call", hook) == ["0"]


def test_what_a_hostile_script_makes_the_hook_read_is_bounded(script: Path, tmp_path: Path) -> None:
    """The work job_process does inside slurmctld is bounded by what it reads (its cost
    is measured by benchmarks/submit_hook.py, not timed here): a header past
    MAX_HEADER is refused, unread beyond it; a directive line past MAX_LINE is refused
    before it is split; the daemon's parser says the same."""
    from slurm_burst.core.staging import MAX_HEADER, MAX_LINE

    head = "#!/bin/sh\n#BB_LUA stage_in src=/d/a dst=x\n"
    cases = {
        "long header": (head + "#\n" * MAX_HEADER + "srun true\n", "runs past 65536 bytes"),
        "long line": (
            "#!/bin/sh\n#BB_LUA stage_in" + " w" * MAX_LINE + "\n",
            f"line 2: a #BB_LUA line of {len('#BB_LUA stage_in') + 2 * MAX_LINE} bytes",
        ),
        "long body": (head + "srun true\n" * 100_000, ""),  # the header is short: taken
        "header at the cap": (head + "#" * (MAX_HEADER - len(head) - 12) + "\nsrun true\n", ""),
    }
    said = process(script, tmp_path, [text for text, _ in cases.values()])
    for (name, (text, why)), lua in zip(cases.items(), said, strict=True):
        if not why:
            assert lua == "0" and parse_stages(text).ins, name
            continue
        assert lua.startswith("-1 ") and why in lua, (name, lua[:200])
        with pytest.raises(StagingError, match=why):
            parse_stages(text)
