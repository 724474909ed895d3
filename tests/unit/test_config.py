"""Config loading: every problem reported with key path and line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_burst.config import ConfigError, check_config, load_config
from tests.conftest import LAB_CONFIG, invoke, lab_config_in

LAB = Path(__file__).resolve().parents[2] / "slurm-conf" / "lab" / "slurm-burst.toml"

GOOD = """
[cluster]
name = "c1"
controller_host = "ctl"
controller_addr = "10.0.0.1"

[slurm]
onprem_partitions = ["batch"]

[mesh]
endpoint = "203.0.113.10"

[providers.aws]
driver = "ec2"
region = "eu-west-1"
credentials = { key_env = "AWS_KEY", secret_env = "AWS_SECRET" }

[node_groups.gpu]
pattern = "gpu-{n:02d}"
count = 3
partition = "burst-gpu"
providers = ["aws"]
sizes = ["g5.xlarge", "g5.2xlarge"]
image = "ami-123"
cpus = 4
memory_mb = 15000
gpus = 1
gpu_type = "a10g"
price_per_hour = { "g5.xlarge" = 1.006, "g5.2xlarge" = 1.212 }
"""


def write(tmp_path: Path, text: str, mode: int = 0o640) -> Path:
    path = tmp_path / "slurm-burst.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_good_config_loads(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    group = cfg.node_groups["gpu"]
    assert group.node_names() == ["gpu-01", "gpu-02", "gpu-03"]
    assert group.hostlist == "gpu-[01-03]"
    assert cfg.group_of("gpu-02") is group and cfg.group_of("gpu-04") is None
    assert cfg.slurm.command_timeout == 30.0  # default filled in
    with pytest.raises(TypeError):
        cfg.node_groups["x"] = group  # type: ignore[index]


def test_shipped_lab_config_is_clean() -> None:
    cfg, problems = check_config(LAB)
    assert cfg is not None and cfg.section("lab") is not None
    assert [p for p in problems if p.severity == "error"] == []


def test_three_planted_mistakes_all_reported_exit_2(tmp_path: Path) -> None:
    bad = (
        GOOD.replace('image = "ami-123"', 'image = "ami-123"\nspot = "yes"')  # wrong type
        .replace('region = "eu-west-1"', 'regoin = "eu-west-1"')  # unknown key (typo)
        .replace('providers = ["aws"]', 'providers = ["gcp"]')
    )  # dangling reference
    path = write(tmp_path, bad)
    result = invoke(["--config", str(path), "config", "check"], expect=2)
    err = result.stderr
    assert "node_groups.gpu.spot: must be true or false, not str" in err
    assert "providers.aws.regoin: unknown key; did you mean 'region'?" in err
    assert "node_groups.gpu.providers: no provider profile 'gcp'" in err
    assert ": 3 error(s)," in err
    lines = {
        ln.split(": error: ")[1].split(":")[0]: ln.split(": error: ")[0].rsplit(":", 1)[1]
        for ln in err.splitlines()
        if ": error: " in ln
    }
    assert lines["providers.aws.regoin"] == str(bad.splitlines().index('regoin = "eu-west-1"') + 1)


def test_check_json_lists_every_problem(tmp_path: Path) -> None:
    bad = (
        GOOD.replace("cpus = 4", "cpus = 0")
        .replace('providers = ["aws"]', 'providers = ["gcp"]')
        .replace('name = "c1"', 'name = "c1"\nnmae = "x"')
    )
    result = invoke(["--config", str(write(tmp_path, bad)), "config", "check", "--json"], expect=2)
    doc = json.loads(result.stdout)
    paths = sorted(p["path"] for p in doc["problems"] if p["severity"] == "error")
    assert paths == ["cluster.nmae", "node_groups.gpu.cpus", "node_groups.gpu.providers"]
    assert doc["ok"] is False


@pytest.mark.parametrize(
    ("edit", "path", "fragment"),
    [
        (
            (
                'credentials = { key_env = "AWS_KEY", secret_env = "AWS_SECRET" }',
                'credentials = { key = "AKIAXXXX" }',
            ),
            "providers.aws.credentials.key",
            "never written",
        ),
        (('pattern = "gpu-{n:02d}"', 'pattern = "gpu-{i}"'), "node_groups.gpu.pattern", "{n}"),
        (
            ('controller_addr = "10.0.0.1"', 'controller_addr = "ctl"'),
            "cluster.controller_addr",
            "IP address",
        ),
        (
            ('"g5.2xlarge" = 1.212', '"g6.xlarge" = 1.2'),
            "node_groups.gpu.price_per_hour.g6.xlarge",
            "not one of the group's sizes",
        ),
        (
            ('onprem_partitions = ["batch"]', 'onprem_partitions = ["burst-gpu"]'),
            "slurm.onprem_partitions",
            "also a burst partition",
        ),
        (("[slurm]", "[slurm]\nupdate_batch = 500"), "slurm.update_batch", "between 1 and 100"),
        (
            ('sizes = ["g5.xlarge", "g5.2xlarge"]', 'sizes = ["gcp:g5.xlarge", "g5.2xlarge"]'),
            "node_groups.gpu.sizes",
            "'gcp' is not one of the group's providers",
        ),
        (
            ('driver = "ec2"', 'driver = "azure_arm"'),
            "providers.aws.resource_group",
            "azure_arm needs it",
        ),
        (
            ('driver = "ec2"', 'driver = "vsphere"'),
            "providers.aws.driver",
            "cannot read a new vsphere instance's SSH host keys",
        ),
        (
            ('driver = "ec2"', 'driver = "ec2"\nhost_keys = "guest-attributes"'),
            "providers.aws.host_keys",
            "not a host-key source of ec2; choose 'console'",
        ),
        (
            ('driver = "ec2"', 'driver = "ec2"\nhost_key_reads_per_second = 1e9'),
            "providers.aws.host_key_reads_per_second",
            "0 (the default) to 10000",
        ),
        (
            ('driver = "ec2"', 'driver = "ec2"\napi_limits = { RunInstances = [5, -2] }'),
            "providers.aws.api_limits.RunInstances",
            "[burst, refill per second]",
        ),
    ],
    ids=[
        "inline-secret",
        "bad-pattern",
        "addr",
        "price-size",
        "onprem-burst",
        "batch",
        "qualified-size",
        "azure-needs",
        "no-host-key-source",
        "wrong-host-key-source",
        "huge-read-rate",
        "bad-api-limit",
    ],
)
def test_semantic_errors(tmp_path: Path, edit: tuple[str, str], path: str, fragment: str) -> None:
    assert edit[0] in GOOD
    _, problems = check_config(write(tmp_path, GOOD.replace(*edit)))
    hits = [p for p in problems if p.path == path and p.severity == "error"]
    assert hits and fragment in hits[0].message, problems


def test_toml_syntax_error_has_line(tmp_path: Path) -> None:
    _, problems = check_config(write(tmp_path, GOOD.replace("cpus = 4", "cpus = = 4")))
    assert len(problems) == 1 and problems[0].line == GOOD.splitlines().index("cpus = 4") + 1


def test_world_writable_config_and_readable_credentials(tmp_path: Path) -> None:
    creds = tmp_path / "aws.toml"
    creds.write_text('key = "k"\nsecret = "s"\n')
    creds.chmod(0o644)
    text = GOOD.replace(
        '{ key_env = "AWS_KEY", secret_env = "AWS_SECRET" }', f'{{ file = "{creds}" }}'
    )
    _, problems = check_config(write(tmp_path, text, mode=0o666))
    messages = [p.message for p in problems if p.severity == "error"]
    assert any("can be changed by others" in m and "writable by anyone" in m for m in messages)
    assert any("mode 0644; only its owner may read it" in m for m in messages)
    creds.chmod(0o640)  # group-readable is not enough either: the docs say 0600
    _, problems = check_config(write(tmp_path, text))
    assert any("mode 0640" in p.message for p in problems if p.severity == "error")


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (("[cluster]", '[providers.aws.options]\nex_force_auth_token = "tok"\n\n[cluster]'),
         "providers.aws.options.ex_force_auth_token"),
        (("[cluster]", '[providers.aws.launch_options]\nAdminPassword = "hunter2"\n\n[cluster]'),
         "providers.aws.launch_options.AdminPassword"),
        (("[cluster]", '[providers.aws.options]\nendpoint = "https://u:pw@api.example"\n\n[cluster]'),
         "providers.aws.options.endpoint"),
        (("[cluster]", '[ledger]\nurl = "postgresql+psycopg://burst:pw@db/ledger"\n\n[cluster]'),
         "ledger.url"),
    ],
    ids=["token-option", "password-launch-option", "url-with-password", "ledger-url-password"],
)  # fmt: skip
def test_secrets_written_anywhere_in_the_config_are_errors(
    tmp_path: Path, edit: tuple[str, str], where: str
) -> None:
    _, problems = check_config(write(tmp_path, GOOD.replace(*edit, 1)))
    hits = [p for p in problems if p.path == where and p.severity == "error"]
    assert hits, [p.render("cfg") for p in problems]
    assert all("pw" not in p.message and "hunter2" not in p.message for p in problems)


def test_missing_env_credentials_is_a_warning(tmp_path: Path) -> None:
    os.environ.pop("AWS_KEY", None)
    _, problems = check_config(write(tmp_path, GOOD))
    assert {p.severity for p in problems if "AWS_KEY" in p.message} == {"warning"}


def test_required_key_with_wrong_type_keeps_other_checks(tmp_path: Path) -> None:
    bad = (
        GOOD.replace("count = 3", 'count = "three"')
        .replace("cpus = 1", "x")
        .replace("[slurm]", "[slurm]\nupdate_batch = 0")
    )
    _, problems = check_config(write(tmp_path, bad))
    paths = {p.path for p in problems if p.severity == "error"}
    assert {"node_groups.gpu.count", "slurm.update_batch"} <= paths


def test_load_raises_with_all_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, GOOD.replace("[cluster]", "[clustr]")))
    assert {p.path for p in info.value.problems} >= {"clustr", "cluster"}


def test_config_path_precedence(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = invoke(["config", "check"], env={"SLURM_BURST_CONFIG": str(path)})
    assert str(path) in result.stdout
    missing = invoke(["--config", str(tmp_path / "nope.toml"), "config", "check"], expect=2)
    assert "cannot read the config" in missing.stderr


def test_spot_on_a_driver_that_cannot_ask_for_it(tmp_path: Path) -> None:
    text = GOOD.replace('driver = "ec2"', 'driver = "openstack"')
    text = text.replace('gpu_type = "a10g"', 'gpu_type = "a10g"\nspot = true')
    _, problems = check_config(write(tmp_path, text))
    assert any(
        p.path == "node_groups.gpu.spot" and "cannot ask it for spot" in p.message for p in problems
    ), problems


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_strict_modes_for_the_config_its_credentials_and_the_slurm_programs(
    tmp_path: Path,
) -> None:
    """Whoever can change the config, a credentials file, or the programs in
    slurm.bin_dir chooses what root runs: each is refused, saying which path and why."""
    tmp_path.chmod(0o755)
    creds = tmp_path / "aws.toml"
    creds.write_text('key = "k"\nsecret = "s"\n')
    creds.chmod(0o600)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n")
    (bin_dir / "scontrol").chmod(0o755)
    text = GOOD.replace(
        '{ key_env = "AWS_KEY", secret_env = "AWS_SECRET" }', f'{{ file = "{creds}" }}'
    ).replace("[slurm]\n", f'[slurm]\nbin_dir = "{bin_dir}"\n', 1)
    path = write(tmp_path, text)

    def errors() -> list[str]:
        return [f"{p.path}: {p.message}" for p in check_config(path)[1] if p.severity == "error"]

    assert errors() == []
    os.chown(path, 65534, -1)
    assert [e for e in errors() if f"the config file {path} can be changed by others" in e]
    os.chown(path, 0, -1)
    os.chown(creds, 65534, -1)
    assert [e for e in errors() if e.startswith("providers.aws.credentials.file") and
            f"{creds} is owned by" in e]  # fmt: skip
    os.chown(creds, 0, -1)
    os.chown(bin_dir / "scontrol", -1, 65534)
    (bin_dir / "scontrol").chmod(0o775)
    assert [e for e in errors() if e.startswith("slurm.bin_dir") and "writable by its group" in e]
    with pytest.raises(ConfigError, match="can be changed by others"):
        load_config(path)


SECOND_GROUP = """
[node_groups.gpu2]
pattern = "gpu2-{n}"
count = 1
partition = "burst-gpu2"
providers = ["aws"]
sizes = ["g5.xlarge"]
image = "ami-456"
cpus = 4
memory_mb = 15000
gpus = 1
price_per_hour = { "g5.xlarge" = PRICE }
"""


def test_groups_sharing_a_size_may_repeat_its_price_but_not_change_it(tmp_path: Path) -> None:
    """Prices are per size (one rate table): two groups on one size (e.g. two images)
    give it the same price; a different one is ambiguous and named."""
    cfg = load_config(write(tmp_path, GOOD + SECOND_GROUP.replace("PRICE", "1.006")))
    assert [r.name for r in cfg.rate_list() if r.size == "g5.xlarge"] == [
        "node_groups.gpu.price_per_hour.g5.xlarge"
    ]
    _, problems = check_config(write(tmp_path, GOOD + SECOND_GROUP.replace("PRICE", "1.5")))
    assert any(
        "node_groups.gpu2.price_per_hour.g5.xlarge" in p.path and "same size" in p.message
        for p in problems
    ), problems


def test_too_few_bootstrap_slots_for_the_largest_group(tmp_path: Path) -> None:
    text = GOOD.replace("count = 3", "count = 1000") + "\n[daemon]\nbootstrap_slots = 10\n"
    _, problems = check_config(write(tmp_path, text))
    hits = [p for p in problems if p.path == "daemon.bootstrap_slots"]
    assert hits and hits[0].message == (
        "10 slots join node group gpu's 1000 nodes in 100 waves: 1060 s at the quickest "
        "(a 60 s boot, 10 s a bootstrap), past slurm.resume_timeout 600 s; use at least 19"
    ), problems
    _, problems = check_config(write(tmp_path, text.replace("= 10\n", "= 19\n")))
    assert not [p for p in problems if p.path == "daemon.bootstrap_slots"], problems
    short = GOOD.replace('onprem_partitions = ["batch"]', 'onprem_partitions = ["batch"]\n'
                         "resume_timeout = 65")  # fmt: skip
    _, problems = check_config(write(tmp_path, short))
    hits = [p for p in problems if p.path == "slurm.resume_timeout"]
    assert hits and "no time for a bootstrap" in hits[0].message, problems

    # no slots at all: said as such, and the slots' sizing is not attempted
    _, problems = check_config(write(tmp_path, text.replace("= 10\n", "= 0\n")))
    assert [p.message for p in problems if p.path == "daemon.bootstrap_slots"] == [
        "must be at least 1"
    ], problems


def test_name_each_max_is_a_count_of_instances(tmp_path: Path) -> None:
    for bad in ("-1", "1000001"):
        _, problems = check_config(write(tmp_path, GOOD + f"\n[daemon]\nname_each_max = {bad}\n"))
        assert [p.message for p in problems if p.path == "daemon.name_each_max"] == [
            "must be between 0 and 1000000"
        ], problems
    _, problems = check_config(write(tmp_path, GOOD + "\n[daemon]\nname_each_max = 0\n"))
    assert not [p for p in problems if p.path == "daemon.name_each_max"], problems


# The lab's spot group (spot_fallback = "ec2", placement = "cluster"), each edit a mistake.
SPOT_GROUP = 'spot_fallback = "ec2"\nspot_fallback_after = 15\nplacement = "cluster"'


@pytest.mark.parametrize(
    ("new", "path", "fragment"),
    [
        (SPOT_GROUP.replace('"ec2"', '"nope"'), "spot_fallback", "no node group 'nope'"),
        (SPOT_GROUP.replace('"ec2"', '"ec2spot"'), "spot_fallback", "is spot: a fallback"),
        (SPOT_GROUP.replace("= 15", "= 30"), "spot_fallback_after",
         "not less than daemon.boot_timeout"),
        (SPOT_GROUP.replace("= 15", "= 1e9"), "spot_fallback_after", "0 to 86,400"),
        (SPOT_GROUP.replace('"cluster"', '"spread"'), "placement",
         "'proximity' (azure_arm) or ''"),
        (SPOT_GROUP + '\nall_or_nothing = "node"', "placement", "all_or_nothing = 'job'"),
    ],
    ids=["unknown-fallback", "spot-fallback", "wait-past-boot", "huge-wait", "strategy",
         "best-effort"],
)  # fmt: skip
def test_spot_fallback_and_placement_mistakes(
    tmp_path: Path, new: str, path: str, fragment: str
) -> None:
    text = LAB_CONFIG.read_text()
    assert SPOT_GROUP in text
    _, problems = check_config(write(tmp_path, text.replace(SPOT_GROUP, new)))
    hits = [p for p in problems if p.path == f"node_groups.ec2spot.{path}"]
    assert hits and fragment in hits[0].message, problems


def test_a_fallback_of_another_shape_and_placement_off_ec2_are_refused(tmp_path: Path) -> None:
    text = LAB_CONFIG.read_text().replace(SPOT_GROUP, SPOT_GROUP.replace('"ec2"', '"cpu"'))
    text = text.replace('providers = ["aws"]\nsizes = ["t3.micro"]\nimage = "ami-12345678"\n'
                        'cpus = 2\nmemory_mb = 1000\nspot = true',
                        'providers = ["lab"]\nsizes = ["ns.cpu2"]\nimage = "host"\n'
                        'cpus = 2\nmemory_mb = 1000\nspot = true', 1)  # fmt: skip
    text = text.replace('price_per_hour = { "t3.micro" = 0.0104 }\n\n# GCE Spot',
                        'price_per_hour = { "ns.cpu2" = 0.085 }\n\n# GCE Spot')  # fmt: skip
    _, problems = check_config(write(tmp_path, text))
    said = {p.path: p.message for p in problems if p.severity == "error"}
    assert "provider 'lab' (nscloud)" in said["node_groups.ec2spot.placement"], said
    assert set(said) == {"node_groups.ec2spot.placement"}, said  # cpu has the same shape


def test_drop_ins_add_to_the_config_in_name_order(tmp_path: Path) -> None:
    """slurm-burst.d/*.toml over slurm-burst.toml: a key replaces, a table adds; a bad
    drop-in is named; a value it set is not blamed on the config's line."""
    path = write(tmp_path, GOOD)
    (tmp_path / "slurm-burst.d").mkdir(mode=0o755)
    (tmp_path / "slurm-burst.d" / "50-policy.toml").write_text(
        "[policy]\nwait_per_dollar = 42\n[policy.accounts.chem]\nmin_wait = 60\n"
    )
    (tmp_path / "slurm-burst.d" / "60-later.toml").write_text("[policy]\nwait_per_dollar = 43\n")
    (tmp_path / "slurm-burst.d" / "notes.txt").write_text("not read")
    cfg = load_config(path)
    assert cfg.policy.wait_per_dollar == 43 and cfg.policy.accounts["chem"].min_wait == 60
    assert cfg.node_groups["gpu"].hostlist == "gpu-[01-03]"  # the rest as it was
    (tmp_path / "slurm-burst.d" / "70-bad.toml").write_text("[policy\n")
    _, problems = check_config(path)
    assert any("70-bad.toml: not valid TOML" in p.message for p in problems)
    (tmp_path / "slurm-burst.d" / "70-bad.toml").write_text("[policy]\nmin_wait = -5\n")
    _, problems = check_config(path)
    bad = [p for p in problems if p.path == "policy.min_wait"]
    assert bad and bad[0].line is None


def test_a_nodes_group_is_read_from_the_patterns_not_from_a_list_of_names(
    tmp_path: Path,
) -> None:
    """gpu-{n:03d} (count 4) and gpu-{n}-a (count 12): each name as its pattern writes
    it and in its range, nothing else (a padded index unpadded, a Unicode digit, a huge
    or negative index, a name of no group)."""
    from slurm_burst.config.model import NodeNames

    text = GOOD.replace('pattern = "gpu-{n:02d}"', 'pattern = "gpu-{n:03d}"')
    text += '\n[node_groups.gpu2]\npattern = "gpu-{n}-a"\ncount = 12\npartition = "b"\n'
    text += 'providers = ["aws"]\nsizes = ["g5.xlarge"]\nimage = "ami-1"\ncpus = 4\n'
    text += "memory_mb = 1000\n"
    cfg, problems = check_config(write(tmp_path, text))
    assert cfg is not None, problems
    count = cfg.node_groups["gpu"].count
    names = NodeNames(cfg.node_groups)
    assert names.index_of("gpu-001") == (cfg.node_groups["gpu"], 1)
    assert names.index_of(f"gpu-{count:03d}") == (cfg.node_groups["gpu"], count)
    assert names.index_of("gpu-12-a") == (cfg.node_groups["gpu2"], 12)
    for other in ("gpu-1", "gpu-0001", f"gpu-{count + 1:03d}", "gpu-000", "gpu-13-a",
                  "gpu-01-a", "gpu-\u00b9\u00b2\u00b3", "gpu-" + "9" * 40, "gpu--1-a",
                  "gpu-", "gpu-1-ab", "cpu-001", ""):  # fmt: skip
        assert names.index_of(other) is None, other
        assert cfg.group_of(other) is None, other
    assert all(cfg.group_of(n) is g for g in cfg.node_groups.values() for n in g.node_names())


DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("extra", "path", "fragment"),
    [
        (f'[images.x]\nref = "Bad Ref"\ndigest = "{DIGEST}"\nlayout = "/srv/x"\n',
         "images.x.ref", "without tag or digest"),
        ('[images.x]\nref = "reg.example.org/ml/x"\ndigest = "latest"\nlayout = "/srv/x"\n',
         "images.x.digest", "sha256:<64"),
        (f'[images.x]\nref = "reg.example.org/ml/x"\ndigest = "{DIGEST}"\nlayout = "srv"\n',
         "images.x.layout", "absolute path"),
    ],
    ids=["ref", "digest", "layout"],
)  # fmt: skip
def test_image_errors(tmp_path: Path, extra: str, path: str, fragment: str) -> None:
    _, problems = check_config(write(tmp_path, GOOD + "\n" + extra))
    hits = [p for p in problems if p.path == path and p.severity == "error"]
    assert hits and fragment in hits[0].message, problems


def test_a_group_names_only_known_images_and_images_need_a_store(tmp_path: Path) -> None:
    text = GOOD.replace('pattern = "gpu-{n:02d}"', 'pattern = "gpu-{n:02d}"\nimages = ["nope"]')
    _, problems = check_config(write(tmp_path, text))
    said = {p.message for p in problems if p.path == "node_groups.gpu.images"}
    assert said == {"no image 'nope' in [images]",
                    "images reach nodes through the staging store: set staging.store"}  # fmt: skip


def test_a_runtime_manifest_not_there_yet_is_a_warning_and_a_bad_one_an_error(
    tmp_path: Path,
) -> None:
    ref = tmp_path / "ref.json"
    text = GOOD.replace('pattern = "gpu-{n:02d}"',
                        f'pattern = "gpu-{{n:02d}}"\nruntime_manifest = "{ref}"\n'
                        'runtime_rule = "close"')  # fmt: skip
    _, problems = check_config(write(tmp_path, text))
    by_path = {p.path: p for p in problems}
    assert by_path["node_groups.gpu.runtime_manifest"].severity == "warning"
    assert by_path["node_groups.gpu.runtime_rule"].message == "must be 'exact' or 'compatible'"
    ref.write_text('{"slurm_burst_runtime": 1, "os": ["debian"]}')
    _, problems = check_config(write(tmp_path, text))
    bad = [p for p in problems if p.path == "node_groups.gpu.runtime_manifest"]
    assert bad[0].severity == "error" and "os: must be text" in bad[0].message


def test_a_bad_runtime_manifest_stops_no_command_only_its_groups_joins(tmp_path: Path) -> None:
    """load_config (every command, every hook) does not read the reference manifests:
    a bad one is config check's error and the runtime step's RuntimeReference, not a
    config error that would stop the resume hook for every group."""
    bad = tmp_path / "ref.json"
    bad.write_text("{not json")
    cfg = lab_config_in(
        tmp_path,
        edits=[("[node_groups.cpu]\n", f'[node_groups.cpu]\nruntime_manifest = "{bad}"\n')],
    )
    assert cfg.node_groups["cpu"].runtime_manifest == str(bad)
    _, problems = check_config(Path(cfg.source))
    assert any(p.path == "node_groups.cpu.runtime_manifest" and p.severity == "error"
               for p in problems)  # fmt: skip
