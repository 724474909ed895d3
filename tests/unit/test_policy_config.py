"""The [policy] table: each key's bounds (NaN and infinities included), the groups it
may name, what enabling it needs, and which setting wins for a job."""

from __future__ import annotations

import pytest

from slurm_burst.config.load import parse_config
from slurm_burst.core.policy import Rule
from tests.unit.test_config import GOOD


def problems(extra: str) -> list[str]:
    _cfg, found = parse_config(GOOD + extra)
    return [f"{p.path}: {p.message}" for p in found if p.severity == "error"]


@pytest.mark.parametrize(
    ("extra", "wanted"),
    [
        ("[policy]\nwait_per_dollar = nan\n",
         "policy.wait_per_dollar: must be a finite number, not nan"),
        ("[policy]\nwait_per_dollar = -1\n", "policy.wait_per_dollar: must be between 0 and 1e+09"),
        ("[policy]\nmin_wait = inf\n", "policy.min_wait: must be a finite number, not inf"),
        ("[policy]\nmin_wait = 1e9\n", "policy.min_wait: must be between 0 and 2.592e+06"),
        ("[policy]\ninterval = 0\n", "policy.interval: must be between 1 and 3600"),
        ("[policy]\nspend_cap = -5\n", "policy.spend_cap: must be between 0 and 1e+12"),
        ("[policy]\ngroups = [\"gpu\", \"tpu\"]\n", "policy.groups: no node group 'tpu'"),
        ("[policy.accounts.physics]\nwait_per_dollar = nan\n",
         "policy.accounts.physics.wait_per_dollar: must be a finite number, not nan"),
        ("[policy.qos.\"bad qos\"]\nonprem_only = true\n",
         "policy.qos.bad qos: must be a Slurm name"),
    ],
    ids=["nan", "negative", "inf", "huge", "interval", "cap", "group", "override", "name"],
)  # fmt: skip
def test_bad_values_are_named(extra: str, wanted: str) -> None:
    assert wanted in problems(extra)


def test_enabling_it_needs_onprem_partitions() -> None:
    text = GOOD.replace('onprem_partitions = ["batch"]\n', "") + "[policy]\nenabled = true\n"
    _cfg, found = parse_config(text)
    assert "policy.enabled: needs slurm.onprem_partitions: the jobs it steers" in [
        f"{p.path}: {p.message}" for p in found
    ]


def test_the_most_specific_setting_wins() -> None:
    cfg, found = parse_config(
        GOOD + "[policy]\nwait_per_dollar = 1800\n"
        "[policy.partitions.batch]\nwait_per_dollar = 900\nmin_wait = 60\n"
        "[policy.accounts.physics]\nwait_per_dollar = 7200\n"
    )  # fmt: skip
    assert cfg is not None and not [p for p in found if p.severity == "error"]
    pol = cfg.policy
    assert pol.rule() == Rule(wait_per_dollar=1800)
    assert pol.rule(partition="batch") == Rule(wait_per_dollar=900, min_wait=60)
    assert pol.rule("physics", "", "batch") == Rule(wait_per_dollar=7200, min_wait=60)
