"""The Ansible collection (ansible/): its TOML filter, the example config it writes, the
unit it installs, its variables checked before any task runs, and ansible-lint."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import ROOT

COLLECTION = ROOT / "ansible"
BIN = Path(sys.executable).parent


def _filter_plugin() -> Any:
    """The collection's filter plugin, loaded from its file as Ansible loads it."""
    path = COLLECTION / "plugins" / "filter" / "toml.py"
    spec = importlib.util.spec_from_file_location("slurm_burst_deploy_toml", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


to_toml = _filter_plugin().to_toml


@pytest.fixture(scope="module")
def collections(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collections path holding this checkout's collection, as an install would."""
    base = tmp_path_factory.mktemp("collections")
    ns = base / "ansible_collections" / "slurm_burst"
    ns.mkdir(parents=True)
    (ns / "deploy").symlink_to(COLLECTION)
    return base


def example_config() -> dict[str, Any]:
    path = COLLECTION / "inventory" / "example" / "group_vars" / "slurm_controller.yml"
    return dict(yaml.safe_load(path.read_text())["slurm_burst_config"])


def test_the_example_config_written_as_toml_is_a_valid_config(tmp_path: Path) -> None:
    from slurm_burst.adapters.cloud.credentials import resolve
    from slurm_burst.config import load_config

    config = example_config()
    text = to_toml(config)
    assert tomllib.loads(text) == config
    # the role writes the credentials file (slurm_burst_credentials) first, where it says
    named = Path(config["providers"]["aws"]["credentials"]["file"]).name
    vars_file = COLLECTION / "inventory" / "example" / "group_vars" / "slurm_controller.yml"
    assert named in yaml.safe_load(vars_file.read_text())["slurm_burst_credentials"]
    creds = tmp_path / named
    creds.write_text('key = "AKIDEXAMPLE"\nsecret = "example"\n')  # the format it documents
    creds.chmod(0o600)
    config["providers"]["aws"]["credentials"]["file"] = str(creds)
    text = to_toml(config)
    path = tmp_path / "slurm-burst.toml"
    path.write_text(text)
    path.chmod(0o600)
    cfg = load_config(path)
    assert cfg.node_groups["cpu"].count == 64 and cfg.providers["aws"].driver == "ec2"
    assert resolve(cfg.providers["aws"], {})["key"] == "AKIDEXAMPLE"


scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
keys = st.text(min_size=1, max_size=8)
values = st.recursive(
    st.one_of(scalars, st.lists(scalars, max_size=3)),
    lambda inner: st.dictionaries(keys, inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(keys, values, max_size=4))
def test_to_toml_round_trips_whatever_a_config_can_hold(data: dict[str, Any]) -> None:
    assert tomllib.loads(to_toml(data)) == data


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"daemon": {"poll_period": math.nan}}, "daemon.poll_period"),
        ({"slurm": {"release": None}}, "slurm.release"),
        ({"node_groups": {"cpu": {"sizes": [b"ns.cpu2"]}}}, "node_groups.cpu.sizes[0]"),
        ({"ledger": {5: "x"}}, "ledger"),
    ],
)
def test_to_toml_refuses_what_toml_cannot_say_and_names_where(
    data: dict[str, Any], where: str
) -> None:
    with pytest.raises(AnsibleFilterError, match=rf"to_toml: {re.escape(where)}: "):
        to_toml(data)


@pytest.mark.parametrize(
    ("unit", "header"),
    [("slurm-burst.service", (4, 3)), ("slurm-burst-stage-gc.service", (5, 5))],
)
def test_the_installed_units_are_the_shipped_ones(unit: str, header: tuple[int, int]) -> None:
    """The role's units with its defaults are slurm-conf/systemd's but for their header
    lines (the gc timer, a plain copy, is the same file): one hardening, in two places,
    never drifting apart."""
    import jinja2

    role = COLLECTION / "roles" / "controller"
    template = role / "templates" / f"{unit}.j2"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = lambda s, pat, rep: re.sub(pat, rep, s)
    variables = {**defaults, "ansible_managed": "managed"}
    variables["slurm_burst_config_dir"] = "/etc/slurm-burst"
    variables["slurm_burst_config_file"] = "/etc/slurm-burst/slurm-burst.toml"
    rendered = env.from_string(template.read_text()).render(variables).splitlines()
    shipped = (ROOT / "slurm-conf" / "systemd" / unit).read_text().splitlines()
    assert rendered[header[0] :] == shipped[header[1] :]
    timer = "slurm-burst-stage-gc.timer"
    assert (role / "files" / timer).read_bytes() == (ROOT / "slurm-conf" / "systemd" / timer
                                                     ).read_bytes()  # fmt: skip


def run_play(collections: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": "/tmp",
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", *args],
        env=env, text=True, capture_output=True, timeout=120, cwd=COLLECTION,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"slurm_burst_ledger": "mysql"}, "slurm_burst_ledger must be one of: sqlite, postgresql"),
        ({"slurm_burst_accounts": {"a": 1}}, "slurm_burst_accounts"),
        ({}, "missing required arguments: slurm_burst_config"),
    ],
)
def test_a_wrong_variable_fails_before_any_task_with_a_message(
    collections: Path, tmp_path: Path, extra: dict[str, Any], says: str
) -> None:
    """argument_specs: Ansible checks the role's variables before its first task (nothing
    on the host is touched; no facts are even gathered here)."""
    variables = {"slurm_burst_config": example_config(), **extra}
    if not extra:
        del variables["slurm_burst_config"]
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "all", "gather_facts": False,
        "roles": [{"role": "slurm_burst.deploy.controller"}],
    }]))  # fmt: skip
    varfile = tmp_path / "vars.yml"
    varfile.write_text(yaml.safe_dump(variables))
    out = run_play(collections, str(play), "-e", f"@{varfile}")
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "Validating arguments against arg spec" in said and says in said, said[-2000:]
    assert "TASK [slurm_burst.deploy.controller : " not in said.replace(
        "TASK [slurm_burst.deploy.controller : Validating arguments", ""
    )


@pytest.mark.skipif(shutil.which("ansible-lint", path=str(BIN)) is None, reason="no ansible-lint")
def test_ansible_lint_production_profile_passes(collections: Path) -> None:
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "NO_COLOR": "1",
    }
    out = subprocess.run(
        [str(BIN / "ansible-lint"), "--nocolor"],
        cwd=COLLECTION, env=env, text=True, capture_output=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "Profile 'production' was required, and it passed" in out.stdout + out.stderr
