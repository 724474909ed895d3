"""The Cloud port contract."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from slurm_burst.core.cloud import CLUSTER_TAG, NODE_TAG, TOKEN_TAG, LaunchSpec, NotFoundError
from slurm_burst.ports import Cloud

_seq = itertools.count(1)


class CloudContract:
    """Subclasses provide fixtures ``cloud`` (a Cloud), ``cluster`` (a cluster name no other
    test uses), ``make_spec`` (node, token, count -> LaunchSpec of a size that exists) and
    ``settle`` (a function that lets time pass: the fake's clock, a real sleep).

    ``boots`` says whether instances ever run (an API emulator's never do): the
    host-key tests need a running instance.
    """

    boots = True

    def _token(self, cluster: str) -> str:
        return f"{cluster}-t{next(_seq)}-{time.monotonic_ns() % 10**6}"

    def test_launch_tags_the_instance_and_lists_it_under_its_cluster(
        self, cloud: Cloud, cluster: str, make_spec: Callable[..., LaunchSpec]
    ) -> None:
        inst = cloud.launch(make_spec("c-1", self._token(cluster)))
        assert inst.id and inst.provider == cloud.name
        got = cloud.get(inst.id)
        assert got is not None and got.tags[CLUSTER_TAG] == cluster
        assert got.tags[NODE_TAG] == "c-1" and got.tags[TOKEN_TAG]
        assert inst.id in {i.id for i in cloud.list_instances(cluster)}
        assert inst.id not in {i.id for i in cloud.list_instances(f"{cluster}-other")}
        cloud.terminate(inst.id)

    def test_the_same_token_never_makes_a_second_instance(
        self, cloud: Cloud, cluster: str, make_spec: Callable[..., LaunchSpec]
    ) -> None:
        token = self._token(cluster)
        a = cloud.launch(make_spec("c-2", token))
        b = cloud.launch(make_spec("c-2", token))
        assert a.id == b.id
        assert [i.id for i in cloud.find(token, cluster)] == [a.id]
        assert cloud.find(self._token(cluster), cluster) == []
        cloud.terminate(a.id)

    def test_a_batch_is_one_call_and_each_instance_has_its_launch_index(
        self, cloud: Cloud, cluster: str, make_spec: Callable[..., LaunchSpec]
    ) -> None:
        if cloud.batch_max < 3:
            pytest.skip(f"{cloud.name} launches one instance per call")
        token = self._token(cluster)
        made = cloud.launch_many(make_spec("c-3", token, count=3))
        assert sorted(i.launch_index for i in made) == [0, 1, 2]
        again = cloud.launch_many(make_spec("c-3", token, count=3))  # a retry: the same ones
        assert sorted(i.id for i in again) == sorted(i.id for i in made)
        assert sorted(i.id for i in cloud.find(token, cluster)) == sorted(i.id for i in made)
        for i in made:
            cloud.terminate(i.id)

    def test_tags_are_added(
        self, cloud: Cloud, cluster: str, make_spec: Callable[..., LaunchSpec]
    ) -> None:
        inst = cloud.launch(make_spec("c-4", self._token(cluster)))
        cloud.tag(inst.id, {NODE_TAG: "c-4b", "Name": "c-4b"})
        got = cloud.get(inst.id)
        assert got is not None and got.tags[NODE_TAG] == "c-4b" and got.tags["Name"] == "c-4b"
        assert got.tags[CLUSTER_TAG] == cluster  # the others stay
        cloud.terminate(inst.id)

    def test_terminate_is_idempotent_and_a_terminated_instance_is_not_found_again(
        self, cloud: Cloud, cluster: str, make_spec: Callable[..., LaunchSpec],
        settle: Callable[[], None],
    ) -> None:  # fmt: skip
        token = self._token(cluster)
        inst = cloud.launch(make_spec("c-5", token))
        cloud.terminate(inst.id)
        cloud.terminate(inst.id)
        settle()
        got = cloud.get(inst.id)
        assert got is None or got.state in ("terminated", "shutting-down")
        assert cloud.find(token, cluster) == []

    def test_unknown_instances(self, cloud: Cloud, cluster: str) -> None:
        missing = "i-0123456789abcdef0"
        assert cloud.get(missing) is None
        cloud.terminate(missing)  # already gone counts as done
        with pytest.raises(NotFoundError):
            cloud.host_keys(missing)

    def test_a_running_instance_shows_its_host_key(
        self, cloud: Cloud, cluster: str, make_spec: Callable[..., LaunchSpec],
        settle: Callable[[], None],
    ) -> None:  # fmt: skip
        if not self.boots:
            pytest.skip(f"{cloud.name}: instances never run here")
        inst = cloud.launch(make_spec("c-6", self._token(cluster)))
        keys: list[tuple[str, str]] = []
        for _ in range(120):
            got = cloud.get(inst.id)
            if got is not None and got.state == "running" and got.address:
                keys = cloud.host_keys(inst.id)
                if keys:
                    break
            settle()
        assert keys and all(t.startswith(("ssh-", "ecdsa-")) and len(k) > 40 for t, k in keys)
        cloud.terminate(inst.id)
