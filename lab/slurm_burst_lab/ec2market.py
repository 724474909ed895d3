"""What the EC2 emulator adds to moto for capacity: placement groups and spot capacity a
test can refuse or withhold (moto 5 has neither).

- **Placement groups**: ``CreatePlacementGroup`` (strategy ``cluster``, ``spread`` or
  ``partition``), ``DeletePlacementGroup`` and ``DescribePlacementGroups`` answered as EC2
  answers them, with EC2's errors: ``InvalidPlacementGroup.Duplicate`` for a name in use,
  ``InvalidPlacementGroup.Unknown`` for one that does not exist (at launch too), and
  ``InvalidPlacementGroup.InUse`` for a delete while any instance in it is not terminated.
  A RunInstances with ``Placement.GroupName`` puts its instances in the group; a group
  given room for N instances (:meth:`Market.room`) refuses a launch that would pass it
  with ``InsufficientInstanceCapacity``, as EC2 does when a cluster placement group's
  spine is full.
- **Spot capacity** (``InstanceMarketOptions.MarketType=spot``): normal, ``refuse`` (the
  launch fails with ``InsufficientInstanceCapacity``, as EC2 answers a spot request it
  has no capacity for) or ``withhold`` (the instances are made and stay ``pending``, their
  VMs never boot: capacity that does not arrive).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

SPOT_MODES = ("", "refuse", "withhold")
STRATEGIES = ("cluster", "spread", "partition")
ErrorDoc = Callable[[str, str], bytes]


@dataclass
class _Group:
    strategy: str
    members: set[str] = field(default_factory=set)
    room: int | None = None  # most instances it holds; None: no limit


class Market:
    def __init__(self, error: ErrorDoc, namespace: str) -> None:
        self._error = error
        self._ns = namespace
        self._lock = threading.Lock()
        self.groups: dict[str, _Group] = {}
        self.spot = ""
        self.withheld: set[str] = set()  # spot instances whose capacity never comes

    # -- what a test does ------------------------------------------------------------
    def set_spot(self, mode: str) -> None:
        if mode not in SPOT_MODES:
            raise ValueError(f"spot mode {mode!r}: one of {', '.join(map(repr, SPOT_MODES))}")
        with self._lock:
            self.spot = mode

    def room(self, name: str, instances: int) -> None:
        with self._lock:
            self.groups.setdefault(name, _Group("")).room = instances

    def snapshot(self) -> dict[str, object]:
        """For a test: each group's strategy and members, the spot mode, the withheld."""
        with self._lock:
            groups = {
                n: {"strategy": g.strategy, "members": sorted(g.members)}
                for n, g in self.groups.items()
                if g.strategy
            }
            return {
                "groups": groups,
                "spot": self.spot,
                "withheld": sorted(self.withheld),
            }

    def clear(self) -> None:
        with self._lock:
            self.spot = ""

    # -- the API ---------------------------------------------------------------------
    def answer(
        self, action: str, args: dict[str, str], alive: Callable[[str], bool]
    ) -> tuple[str, bytes] | None:
        """(status, body) of a placement-group call; None for any other action.
        ``alive(instance_id)``: the instance is not terminated (moto's records)."""
        name = args.get("GroupName", "")
        if action == "CreatePlacementGroup":
            strategy = args.get("Strategy", "")
            if strategy not in STRATEGIES:
                return "400 Bad Request", self._error(
                    "InvalidParameterValue", f"Strategy {strategy!r} is not valid"
                )
            with self._lock:
                if name in self.groups and self.groups[name].strategy:
                    return "400 Bad Request", self._error(
                        "InvalidPlacementGroup.Duplicate",
                        f"The Placement Group '{name}' already exists.")  # fmt: skip
                self.groups[name] = _Group(strategy, room=self._room_of(name))
            return "200 OK", self._ok("CreatePlacementGroupResponse")
        if action == "DeletePlacementGroup":
            with self._lock:
                group = self.groups.get(name)
                if group is None or not group.strategy:
                    return "400 Bad Request", self._error(
                        "InvalidPlacementGroup.Unknown",
                        f"The Placement Group '{name}' is unknown.")  # fmt: skip
                if any(alive(i) for i in group.members):
                    return "400 Bad Request", self._error(
                        "InvalidPlacementGroup.InUse",
                        f"Placement group '{name}' is in use and cannot be deleted.")  # fmt: skip
                del self.groups[name]
            return "200 OK", self._ok("DeletePlacementGroupResponse")
        if action == "DescribePlacementGroups":
            wanted = {v for k, v in args.items() if k.startswith("GroupName.")}
            with self._lock:
                items = "".join(
                    f"<item><groupName>{escape(n)}</groupName><strategy>{g.strategy}</strategy>"
                    "<state>available</state></item>"
                    for n, g in self.groups.items()
                    if g.strategy and (not wanted or n in wanted)
                )
            return "200 OK", self._answer(
                "DescribePlacementGroupsResponse", f"<placementGroupSet>{items}</placementGroupSet>"
            )
        return None

    def refuse_run(self, args: dict[str, str], alive: Callable[[str], bool]) -> bytes | None:
        """EC2's error for a RunInstances this market cannot serve, else None."""
        name = args.get("Placement.GroupName", "")
        want = int(args.get("MinCount", 1) or 1)
        with self._lock:
            if name:
                group = self.groups.get(name)
                if group is None or not group.strategy:
                    return self._error("InvalidPlacementGroup.Unknown",
                                       f"The Placement Group '{name}' is unknown.")  # fmt: skip
                held = sum(1 for i in group.members if alive(i))
                if group.room is not None and held + want > group.room:
                    return self._error(
                        "InsufficientInstanceCapacity",
                        f"We currently do not have sufficient {args.get('InstanceType')} "
                        f"capacity in the placement group '{name}'",
                    )
            if _is_spot(args) and self.spot == "refuse":
                return self._error(
                    "InsufficientInstanceCapacity",
                    f"There is no Spot capacity available that matches your request "
                    f"({args.get('InstanceType')})",
                )
        return None

    def made(self, args: dict[str, str], instance_ids: Iterable[str]) -> set[str]:
        """Note a launch's instances; returns those withheld (they must not boot)."""
        ids = set(instance_ids)
        name = args.get("Placement.GroupName", "")
        with self._lock:
            if name and name in self.groups:
                self.groups[name].members |= ids
            if _is_spot(args) and self.spot == "withhold":
                self.withheld |= ids
                return ids
        return set()

    def is_withheld(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self.withheld

    def _room_of(self, name: str) -> int | None:
        group = self.groups.get(name)  # room given before the group was made
        return group.room if group is not None else None

    def _ok(self, response: str) -> bytes:
        return self._answer(response, "<return>true</return>")

    def _answer(self, response: str, inner: str) -> bytes:
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<{response} {self._ns}>'
            f"<requestId>00000000-0000-0000-0000-000000000004</requestId>{inner}</{response}>"
        ).encode()


def _is_spot(args: dict[str, str]) -> bool:
    return args.get("InstanceMarketOptions.MarketType", "") == "spot"
