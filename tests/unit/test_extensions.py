"""The extension points (slurm_burst.extensions): what a plugin adds reaches the config,
the cloud adapter and the CLI, and nothing else; a broken or greedy plugin is named."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_burst import extensions
from slurm_burst.cli.main import cli
from slurm_burst.config.load import parse_config
from slurm_burst.config.model import doc
from slurm_burst.config.schema import Problem
from slurm_burst.extensions import CloudDriver, ConfigSection, ExtensionError, Plugin

pytestmark = pytest.mark.unit

BASE = """
[cluster]
name = "c"
controller_host = "ctl"
controller_addr = "10.0.0.1"
"""


@dataclass(frozen=True)
class Widget:
    size: int = doc("How big.", default=1)
    colour: str = doc("Which colour.", default="red")


def check_widget(section: Widget, cfg: Any) -> list[Problem]:
    return [] if section.size < 10 else [Problem("widget.size", "must be below 10")]


WIDGET = Plugin(
    name="widgets",
    sections=(ConfigSection("widget", Widget, validate=f"{__name__}:check_widget"),),
    clouds=(
        CloudDriver(
            name="tincan",
            target="libcloud.compute.drivers.dummy:DummyNodeDriver",
            host_key_sources={"console": "slurm_burst.adapters.cloud.attest:Console"},
            reads_per_second=7.0,
            credentials=False,
            spot=True,
        ),
    ),
    commands={"widget": "slurm_burst.cli.hostlist_cmd:group"},
)


@pytest.fixture
def plugins() -> Iterator[None]:
    extensions.use((WIDGET,))
    yield
    extensions.use(None)


@pytest.fixture
def no_plugins() -> Iterator[None]:
    extensions.use(())
    yield
    extensions.use(None)


def errors(problems: list[Problem]) -> list[str]:
    return [f"{p.path}: {p.message}" for p in problems if p.severity == "error"]


def test_a_plugins_section_is_built_into_its_dataclass_and_checked(plugins: None) -> None:
    cfg, problems = parse_config(BASE + '[widget]\nsize = 3\ncolour = "blue"\n')
    assert cfg is not None and errors(problems) == []
    assert cfg.section("widget") == Widget(size=3, colour="blue")
    _, problems = parse_config(BASE + "[widget]\nsize = 12\nshape = 1\n")
    assert errors(problems) == ["widget.shape: unknown key", "widget.size: must be below 10"]
    _, problems = parse_config(BASE + '[widget]\nsize = "big"\n')
    assert [e.split(":")[0] for e in errors(problems)] == ["widget.size"]
    _, problems = parse_config("widget = 3\n" + BASE)
    assert errors(problems) == ["widget: must be a table"]


def test_without_the_plugin_its_section_and_driver_are_unknown(no_plugins: None) -> None:
    text = BASE + '[widget]\nsize = 3\n[providers.p]\ndriver = "tincan"\n'
    _, problems = parse_config(text, driver_exists=lambda _name: False)
    assert errors(problems) == [
        "widget: unknown key",
        "providers.p.driver: libcloud has no compute driver 'tincan'",
        "providers.p.driver: slurm-burst cannot read a new tincan instance's SSH host keys "
        "through the provider's API, so no node could join (nothing to trust); use azure_arm, "
        "ec2, gce or openstack (docs/providers.md, 'Host keys')",
    ]


def test_a_plugins_driver_is_a_libcloud_driver_with_its_traits(plugins: None) -> None:
    from libcloud.compute.drivers.dummy import DummyNodeDriver

    from slurm_burst.adapters.cloud.attest import Console
    from slurm_burst.adapters.cloud.credentials import resolve
    from slurm_burst.adapters.cloud.registry import driver_class, driver_exists, provider

    assert driver_class("tincan") is DummyNodeDriver and driver_exists("tincan")
    tincan = provider("tincan")
    assert tuple(tincan.host_key_sources) == ("console",)
    assert tincan.host_key_reads_per_second == 7.0
    assert provider("ec2").host_key_reads_per_second == 10.0  # a built-in provider's own
    assert isinstance(tincan.host_key_source(object()), Console)
    cfg, problems = parse_config(
        BASE + '[providers.p]\ndriver = "tincan"\n', driver_exists=driver_exists
    )
    assert cfg is not None and errors(problems) == []
    assert resolve(cfg.providers["p"], environ={}) == {}  # needs no credentials


def test_a_plugins_command_joins_the_cli(plugins: None) -> None:
    out = CliRunner().invoke(cli, ["widget", "expand", "n[1-2]"])
    assert out.exit_code == 0 and out.output.split() == ["n1", "n2"]
    assert "widget" in CliRunner().invoke(cli, ["--help"]).output


def test_two_plugins_claiming_one_name_are_refused() -> None:
    twin = Plugin(name="twin", sections=(ConfigSection("widget", Widget),))
    with pytest.raises(ExtensionError, match="'twin' adds section 'widget', which 'widgets'"):
        extensions.use((WIDGET, twin))
    greedy = Plugin(name="greedy", clouds=(CloudDriver("ec2", "x:Y"),))
    with pytest.raises(ExtensionError, match="'greedy' adds driver 'ec2', which 'slurm-burst'"):
        extensions.use((greedy,))
    extensions.use(None)


def test_a_plugin_that_cannot_load_is_named_in_config_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Broken:
        name, value = "broken", "no_such_module:PLUGIN"

        def load(self) -> Any:
            raise ModuleNotFoundError("No module named 'no_such_module'")

    monkeypatch.setattr(extensions, "entry_points", lambda group: [Broken()])
    extensions.use(None)
    try:
        _, problems = parse_config(BASE + "[widget]\nsize = 1\n")
        assert errors(problems) == [
            "widget: plugin 'broken' (no_such_module:PLUGIN) cannot be loaded: "
            "ModuleNotFoundError: No module named 'no_such_module'"
        ]
        # a config without a plugin's table never loads plugins: the hooks stay quick
        cfg, problems = parse_config(BASE)
        assert cfg is not None and errors(problems) == []
    finally:
        extensions.use(None)


def test_a_target_that_is_not_there_says_which() -> None:
    with pytest.raises(ExtensionError, match=r"'slurm_burst\.core:nothing' cannot be imported"):
        extensions.resolve("slurm_burst.core:nothing")
