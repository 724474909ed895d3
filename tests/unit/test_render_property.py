"""`conf render` cannot be made to write a setting the config did not mean.

Hypothesis writes configs whose Slurm-bound values (group and partition names, the hook
and conf directories, MaxTime, on-prem partitions, features, GPU type and device files,
the health check program, on-prem-only accounts, the config's own path) are drawn from
text full of what breaks a Slurm line: newlines and other controls, blanks, '#', quotes,
backslashes, '=', non-ASCII digits, bidirectional overrides. For every config that
loads, the rendered files read back with Slurm's line syntax
(:func:`slurm_burst.core.slurmsyntax.tokenize`) must hold exactly the settings the
config means, computed here from the config on its own; a config that holds anything
else must fail to load, never render.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_burst.config import Config
from slurm_burst.config.load import parse_config
from slurm_burst.core.slurmsyntax import tokenize
from slurm_burst.services.slurmconf import FRAGMENT, GRES, RenderError, render
from tests.conftest import examples

pytestmark = pytest.mark.unit

# What breaks a Slurm line, and what a valid value is made of.
NASTY = "\n\r\t \x00\x0b\x1b\x7f\x85\u2028\u202e#\"'\\=,:%[]-_./" + "¹²٣" + "é"
SAFE = "abcXYZ019"
TEXT = st.text(alphabet=st.sampled_from(NASTY + SAFE), min_size=0, max_size=12)
NAMEISH = st.one_of(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True), TEXT)
PATHISH = st.one_of(
    st.from_regex(r"(/[a-z0-9._+@-]{1,6}){1,3}", fullmatch=True), TEXT.map("/".__add__)
)
TIMES = st.one_of(
    st.sampled_from(["INFINITE", "UNLIMITED", "60", "1:00:00", "2-00:00:00", "3-12", "90:30"]),
    TEXT,
)
RELEASES = st.sampled_from(["22.05", "24.11", "26.05"])


def q(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, str]:
    """(TOML text, the config's path) with hostile values where Slurm reads them."""
    group = draw(NAMEISH)
    part = draw(NAMEISH)
    onprem = draw(st.lists(NAMEISH, max_size=2))
    features = draw(st.lists(NAMEISH, max_size=2))
    gpus = draw(st.integers(0, 2))
    gpu_type = draw(st.one_of(st.just(""), NAMEISH)) if gpus else ""
    gpu_files = draw(st.one_of(st.just(""), PATHISH)) if gpus else ""
    hc = draw(st.one_of(st.just(""), PATHISH))
    denied = draw(st.lists(NAMEISH, max_size=2))
    text = f"""
[cluster]
name = "c1"
controller_host = "ctl"
controller_addr = "10.0.0.1"
[slurm]
onprem_partitions = [{", ".join(q(p) for p in onprem)}]
hook_dir = {q(draw(PATHISH))}
conf_dir = {q(draw(PATHISH))}
[mesh]
endpoint = "203.0.113.10"
[providers.aws]
driver = "ec2"
[node_groups.{q(group)}]
pattern = "n-{{n}}"
count = 3
partition = {q(part)}
providers = ["aws"]
sizes = ["m5.large"]
image = "ami-1"
cpus = 2
memory_mb = 1000
gpus = {gpus}
features = [{", ".join(q(f) for f in features)}]
{f"gpu_type = {q(gpu_type)}" if gpu_type else ""}
{f"gpu_files = {q(gpu_files)}" if gpu_files else ""}
[partitions.{q(part)}]
max_time = {q(draw(TIMES))}
[gpu]
health_check_program = {q(hc)}
"""
    for account in denied:
        text += f"[policy.accounts.{q(account)}]\nonprem_only = true\n"
    return text, "/etc/slurm-burst/" + draw(st.one_of(st.just("slurm-burst.toml"), TEXT))


def intended(cfg: Config) -> tuple[Counter[tuple[str, str]], list[dict[str, str]]]:
    """What the fragment must set, from the config alone: the global settings that carry
    a config value, and each node and partition line as a dict."""
    s = cfg.slurm
    glob: Counter[tuple[str, str]] = Counter(
        (f"{key}Program", f"{s.hook_dir}/slurm-burst-{hook}")
        for key, hook in (
            ("Resume", "resume"),
            ("Suspend", "suspend"),
            ("ResumeFail", "resume-fail"),
        )
    )
    glob[("PrologSlurmctld", f"{s.hook_dir}/slurm-burst-prolog-slurmctld")] += 1
    if s.onprem_partitions:
        glob[("SuspendExcParts", ",".join(s.onprem_partitions))] += 1
    if cfg.gpu.health_check_program:
        glob[("HealthCheckProgram", cfg.gpu.health_check_program)] += 1
    lines: list[dict[str, str]] = []
    for g in cfg.node_groups.values():
        node = {"NodeName": g.hostlist, "State": "CLOUD", "CPUs": str(g.cpus),
                "RealMemory": str(g.memory_mb)}  # fmt: skip
        if g.features:
            node["Features"] = ",".join(g.features)
        if g.gpus:
            node["Gres"] = f"gpu:{g.gpu_type}:{g.gpus}" if g.gpu_type else f"gpu:{g.gpus}"
        lines.append(node)
        pcfg = cfg.partitions.get(g.partition)
        part = {"PartitionName": g.partition, "Nodes": g.hostlist,
                "MaxTime": pcfg.max_time if pcfg else "INFINITE"}  # fmt: skip
        denied = sorted(a.lower() for a, o in cfg.policy.accounts.items() if o.onprem_only)
        if denied:
            part["DenyAccounts"] = ",".join(denied)
        lines.append(part)
    return glob, lines


def read_back(text: str) -> list[dict[str, str]]:
    return [{st.key: st.value for st in line} for line in tokenize(text)]


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=configs(), release=RELEASES)
def test_what_loads_renders_exactly_what_it_means(case: tuple[str, str], release: str) -> None:
    text, source = case
    cfg, problems = parse_config(text, source)
    if cfg is None or any(p.severity == "error" for p in problems):
        return  # refused at load, with its file:line: nothing can be rendered from it
    try:
        files = render(cfg, release)
    except RenderError as exc:  # the renderer's guard held, but the loader let it through
        pytest.fail(f"loaded, then refused by the renderer: {exc}")
    lines = read_back(files[FRAGMENT])
    glob, wanted = intended(cfg)
    singles = Counter((k, v) for line in lines if len(line) == 1 for k, v in line.items())
    for setting, count in glob.items():
        assert singles[setting] == count, (setting, files[FRAGMENT])
    heads = [ln for ln in lines if "NodeName" in ln or "PartitionName" in ln]
    for want in wanted:
        assert any(want.items() <= got.items() for got in heads), (want, heads)
    assert len(heads) == len(wanted), heads
    gres = read_back(files[GRES])
    gpu_groups = [g for g in cfg.node_groups.values() if g.gpus]
    assert [ln["NodeName"] for ln in gres] == [g.hostlist for g in gpu_groups]
    for ln, g in zip(gres, gpu_groups, strict=True):
        assert ln["File"] == g.gres_files and ln.get("Type", "") == g.gpu_type


def _config_with(**where: Any) -> str:
    return f"""
[cluster]
name = "c1"
controller_host = "ctl"
controller_addr = "10.0.0.1"
[slurm]
onprem_partitions = [{q(where.get("onprem", "batch"))}]
hook_dir = {q(where.get("hook_dir", "/usr/local/bin"))}
[mesh]
endpoint = "203.0.113.10"
[providers.aws]
driver = "ec2"
[node_groups.{q(where.get("group", "cpu"))}]
pattern = "n-{{n}}"
count = 2
partition = {q(where.get("partition", "burst"))}
providers = ["aws"]
sizes = ["m5.large"]
image = "ami-1"
cpus = 2
memory_mb = 1000
[partitions.burst]
max_time = {q(where.get("max_time", "INFINITE"))}
"""


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ({"group": "cpu\n"}, "node_groups"),
        ({"partition": "burst\nSlurmUser=root"}, "node_groups.cpu.partition"),
        ({"hook_dir": "/usr/bin\nSlurmUser=root"}, "slurm.hook_dir"),
        ({"hook_dir": "/usr/local/bin #"}, "slurm.hook_dir"),
        ({"max_time": "60\nSlurmUser=root"}, "partitions.burst.max_time"),
        ({"max_time": "¹:00"}, "partitions.burst.max_time"),
        ({"onprem": "batch\n"}, "slurm.onprem_partitions"),
        ({"onprem": "batch\u2028"}, "slurm.onprem_partitions"),
    ],
    ids=[
        "group",
        "partition",
        "hook_dir",
        "hook_dir-comment",
        "max_time",
        "max_time-digits",
        "onprem",
        "onprem-separator",
    ],
)
def test_each_reported_injection_is_refused_at_load_with_its_line(
    where: dict[str, str], key: str
) -> None:
    """The cases the second hardening round found: each refused, naming key and line."""
    from slurm_burst.config.load import _key_lines, _with_line

    text = _config_with(**where)
    _cfg, problems = parse_config(text, "site.toml")
    errors = [_with_line(p, _key_lines(text)) for p in problems if p.severity == "error"]
    assert errors, f"{where} loaded"
    assert any(p.path.startswith(key) and p.line for p in errors), errors
    assert all("\n" not in p.render("site.toml") for p in errors)


def test_a_config_path_with_a_newline_is_refused_by_the_renderer() -> None:
    """The path is written into both files' header comment: one that would break out of
    it is refused (load refuses it too, with the file's own name)."""
    cfg, problems = parse_config(_config_with(), "/etc/x\nSlurmUser=root.toml")
    assert cfg is not None and [p.message for p in problems if "path holds" in p.message]
    with pytest.raises(RenderError, match="comment"):
        render(cfg, "24.11")
