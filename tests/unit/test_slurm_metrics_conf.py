"""slurm.metrics: slurmctld's own OpenMetrics as the fragment turns them on, by release,
and what config check says of each setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_burst.config.load import check_config
from slurm_burst.services.slurmconf import RenderError, check_rendered, render
from tests.conftest import LAB_CONFIG, lab_config_in


def settings(fragment: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in fragment.splitlines()
                if ln.startswith("Metrics"))  # fmt: skip


def test_off_writes_nothing_and_open_turns_them_on_past_private_data(tmp_path: Path) -> None:
    cfg = lab_config_in(tmp_path)
    assert settings(render(cfg, "26.05")["slurm-burst.conf"]) == {}
    opened = lab_config_in(tmp_path, edits=[("[slurm]\n", '[slurm]\nmetrics = "open"\n')])
    frag = render(opened, "26.05")["slurm-burst.conf"]
    check_rendered("slurm-burst.conf", frag)
    assert settings(frag) == {
        "MetricsType": "metrics/openmetrics",
        "MetricsParameters": "ignore_private_data",  # PrivateData=cloud would restrict them
    }
    assert "PrivateData=cloud" in frag
    for old in ("22.05", "24.11"):
        with pytest.raises(RenderError, match=r"25\.11 or newer"):
            render(opened, old)


def test_users_names_who_may_scrape_on_26_05_only(tmp_path: Path) -> None:
    cfg = lab_config_in(
        tmp_path,
        edits=[("[slurm]\n", '[slurm]\nmetrics = "users"\nmetrics_users = ["prometheus"]\n')],
    )
    frag = render(cfg, "26.05")["slurm-burst.conf"]
    assert settings(frag) == {
        "MetricsType": "metrics/openmetrics",
        "MetricsAuthUsers": "prometheus",
    }
    with pytest.raises(RenderError, match=r"26\.05 or newer"):
        render(cfg, "24.11")


@pytest.mark.parametrize(
    ("slurm", "severity", "words"),
    [
        ('metrics = "all"', "error", "must be 'off', 'open' or 'users'"),
        ('metrics = "users"', "error", "must name at least one user"),
        ('metrics = "users"\nmetrics_users = ["a b"]', "error", "is not a user name"),
        ('metrics = "open"\nrelease = "24.11"', "error", "needs Slurm 25.11 or newer"),
        ('metrics = "users"\nmetrics_users = ["p"]\nrelease = "24.11"', "error", "26.05"),
        ('metrics = "open"', "warning", "without authentication"),
    ],
)
def test_config_check_says_what_each_setting_needs(
    tmp_path: Path, slurm: str, severity: str, words: str
) -> None:
    text = LAB_CONFIG.read_text().replace("/var/lib/slurm-burst-lab", f"{tmp_path}/lab")
    path = tmp_path / "c.toml"
    path.write_text(text.replace("[slurm]\n", f"[slurm]\n{slurm}\n", 1))
    path.chmod(0o640)
    _cfg, problems = check_config(path)
    found = [p for p in problems if p.path.startswith("slurm.metrics")]
    assert any(p.severity == severity and words in p.message for p in found), found
