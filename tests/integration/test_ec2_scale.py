"""An EC2 burst through the daemon's real path against the emulator in scale mode, its
buckets scaled down so that EC2 throttles: every node joins, none fails for it, and the
daemon slows down instead of hammering (the 1,000-node figures: benchmarks/scale.py)."""

from __future__ import annotations

import sys

import pytest
from slurm_burst_lab.ec2emu import RemoteEmulator, Scale

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402  (benchmarks/scale.py: the same run, smaller)


def test_a_throttled_burst_joins_every_node_and_fails_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SB_TEST_AWS_KEY", "AKIDEMULATOR000000000")
    monkeypatch.setenv("SB_TEST_AWS_SECRET", "emulator-secret")
    r = scale.run(24, Scale(throttle=0.1, boot=3.0, console=2.0), join_s=1.0)
    assert r["nodes_joined"] == 24 and r["nodes_failed"] == 0, r
    assert r["throttled_answers"] > 0, r  # EC2's buckets at a tenth: it did throttle
    assert r["calls"]["RunInstances"] == 1 and r["calls"]["DescribeInstanceTypes"] == 1, r
    # throttled answers are calls too; without them each node costs about two
    assert r["calls_per_joined_node"] - r["throttled_answers"] / 24 <= 3.0, r
    assert r["calls"].get("DescribeAddresses", 0) == 0, r  # no per-read address lookups


def test_throttling_is_switched_on_and_off_while_the_emulator_runs() -> None:
    """The lab's emulator (instances booting as VMs) gets EC2's throttling at run time:
    a burst of describes past the scaled bucket is refused as EC2 refuses it."""
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.core.cloud import ThrottledError

    emu = RemoteEmulator()
    try:
        cloud = LibcloudCloud("aws", emu.driver())
        for _ in range(30):  # unthrottled
            cloud.list_fleet("c", lambda: None)
        emu.throttle(0.05)  # DescribeInstances: 5 at once, then 1 a second
        refused = 0
        for _ in range(30):
            try:
                cloud.list_fleet("c", lambda: None)
            except ThrottledError as exc:
                assert exc.code == "RequestLimitExceeded"
                refused += 1
        assert 20 <= refused <= 25, refused
        assert emu.timeline()["throttled"] == refused
        emu.throttle(0)
        for _ in range(30):
            cloud.list_fleet("c", lambda: None)
    finally:
        emu.stop()


@pytest.mark.parametrize("scaled", [False, True], ids=["moto", "scale-mode"])
def test_the_fleet_listing_pages_through_next_token(
    scaled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One listing in pages (MaxResults, NextToken), a budget token taken before each,
    the cluster's live instances only: moto's own answer and the scale mode's."""
    from libcloud.compute.base import NodeImage

    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.providers import ec2

    emu = RemoteEmulator(Scale(throttle=0, boot=0, console=0) if scaled else None)
    try:
        driver = emu.driver()
        size = next(s for s in driver.list_sizes() if s.id == "c5.large")
        image = NodeImage("ami-12c6146b", "x", driver)
        for cluster, count in (("mine", 12), ("other", 3)):
            driver.create_node(
                name="x", size=size, image=image, ex_mincount=count, ex_maxcount=count,
                ex_metadata={"slurm-burst-cluster": cluster},
            )  # fmt: skip
        cloud = LibcloudCloud("aws", driver)
        gone = cloud.list_fleet("mine", lambda: None)[0].id
        cloud.terminate(gone)
        monkeypatch.setattr(ec2, "PAGE", 5)
        pages: list[int] = []
        listed = cloud.list_fleet("mine", lambda: pages.append(1))
        assert len(listed) == 11 and gone not in {i.id for i in listed}
        assert {i.tags["slurm-burst-cluster"] for i in listed} == {"mine"}
        # the scale mode pages by instance (5 + 5 + 1); moto by reservation, and these
        # 11 are in one
        assert len(pages) == (3 if scaled else 1), pages
        assert emu.calls().get("DescribeAddresses", 0) == 0
    finally:
        emu.stop()
