"""The Scheduler port contract (the writes the daemon makes, read back)."""

from __future__ import annotations

import pytest

from slurm_burst.core.slurm import SchedulerError, SlurmNode
from slurm_burst.ports import Scheduler


class SchedulerContract:
    """Subclasses provide ``scheduler`` and ``names``: two cloud nodes, powered down and
    idle, that nothing else touches while the test runs (the test leaves them so)."""

    def _node(self, scheduler: Scheduler, name: str) -> SlurmNode:
        return next(n for n in scheduler.nodes() if n.name == name)

    def test_a_reason_is_data_not_a_shell_word(
        self, scheduler: Scheduler, names: list[str]
    ) -> None:
        reason = """it's "quoted"; $(touch /tmp/pwned) `id` & more (Code:X)"""
        scheduler.update_nodes(names, state="drain", reason=reason)
        try:
            for name in names:
                n = self._node(scheduler, name)
                assert n.reason == reason and "DRAIN" in n.flags and n.is_cloud
        finally:
            scheduler.update_nodes(names, state="resume")
        assert all("DRAIN" not in self._node(scheduler, n).flags for n in names)

    def test_node_addresses_pair_with_names(self, scheduler: Scheduler, names: list[str]) -> None:
        scheduler.update_nodes(names, addrs=["10.77.9.2", "10.77.9.3"], hostnames=names)
        try:
            assert [self._node(scheduler, n).addr for n in names] == ["10.77.9.2", "10.77.9.3"]
        finally:
            scheduler.update_nodes(names, addrs=names, hostnames=names)
        assert [self._node(scheduler, n).addr for n in names] == names
        with pytest.raises(ValueError):
            scheduler.update_nodes(names, addrs=["10.77.9.2"])
        with pytest.raises(ValueError):
            scheduler.update_nodes(names)

    def test_an_unknown_node_is_refused(self, scheduler: Scheduler) -> None:
        with pytest.raises(SchedulerError, match="Invalid node name"):
            scheduler.update_nodes(["no-such-node"], state="drain", reason="x")

    def test_burst_nodes_are_cloud_nodes_in_a_partition(
        self, scheduler: Scheduler, names: list[str]
    ) -> None:
        nodes = {n.name: n for n in scheduler.nodes()}
        for name in names:
            assert nodes[name].is_cloud and nodes[name].partitions
        parts = {p.name for p in scheduler.partitions()}
        assert set(nodes[names[0]].partitions) <= parts
        assert scheduler.ping()
