"""A Compute Engine API emulator on loopback (tests, the lab): the part of Compute's
REST API that libcloud's GCE driver and slurm-burst's GCE adapter call, answered as
Compute answers (the request and answer shapes of ``compute.v1.json``, Compute's own
discovery document; ``tests/integration/test_gce_emulator.py`` checks every request
and answer against it).

No emulator on the registries fits: the ones there patch Google's client libraries and
boot nothing. This one is written for the lab. It serves:

- the OAuth token exchange of a service account (``POST /token``; libcloud posts a
  signed JWT; the emulator checks its shape, not its signature);
- zones, regions, machine types, disk types, accelerator types, networks,
  subnetworks and images (one project of the lab's own and ``debian-cloud``), enough
  for libcloud's lookups before a launch;
- instances: ``insert``, ``bulkInsert`` (zonal and regional: ``count``, ``minCount``,
  ``perInstanceProperties`` names, ``namePattern``, ``locationPolicy``), ``get``,
  ``list`` and ``aggregatedList`` with ``filter``, ``maxResults`` and ``pageToken``,
  ``delete``, ``setLabels``; their boot disks (``disks``);
- operations, zonal, regional and global: ``get``, ``wait``, and ``list`` filtered
  on ``operationGroupId`` (a bulk insert's per-instance operations);
- ``requestId`` idempotency: a mutation repeated with the same id answers the first
  operation (a ``bulkInsert`` repeat after a crash makes nothing twice);
- guest attributes (``getGuestAttributes?queryPath=hostkeys/``) and serial port 1
  output, from what a test or a booted VM publishes (:meth:`GceEmulator.publish`);
- capacity a test can refuse per machine type and zone (``ZONE_RESOURCE_POOL_EXHAUSTED``,
  ``QUOTA_EXCEEDED``: :meth:`GceEmulator.limit`), faults injected per method;
- Spot VMs (``provisioningModel = SPOT``, or ``preemptible``) whose capacity a test can
  refuse (the insert's operation fails ``ZONE_RESOURCE_POOL_EXHAUSTED``) or withhold (the
  instances are made and stay STAGING, their VMs never boot): :meth:`GceEmulator.set_spot`;
  and preemption (:meth:`GceEmulator.preempt`): the instance's metadata server answers
  ``preempted`` TRUE at once, and the instance is deleted (``instanceTerminationAction``
  DELETE; STOP: TERMINATED) the given seconds later (Compute: about 30), its VM halted;
- compact placement policies (``resourcePolicies`` insert, get, list, delete, with
  ``groupPlacementPolicy.collocation``): an instance that names one must be in its
  region and set ``onHostMaintenance = TERMINATE``; a policy holds at most 150 instances
  (Google's documented limit) or the room a test gives it (:meth:`GceEmulator.policy_room`,
  past it ``ZONE_RESOURCE_POOL_EXHAUSTED``), and a delete while an instance names it is
  refused ``resourceInUseByAnotherResource``;
- rate quotas as Compute counts them, in scale mode (:class:`Quotas`): calls per quota
  group in each 60-s interval of the wall clock, answering 403 ``rateLimitExceeded``
  past it (or 429, as Compute sometimes does);
- booting (opt-in, :class:`~slurm_burst_lab.labvms.LabVms`; the lab): each instance
  becomes a namespace VM on the lab's cloud bridge at its ``networkIP`` (the emulator's
  address range there), running its ``startup-script``, root's authorized keys those
  of its ``ssh-keys`` metadata, its host name its own name; its serial port 1 is the
  VM's console, and its ``hostkeys/`` guest attributes the host keys printed there (what
  Google's guest environment publishes); its metadata server answers inside its network
  namespace (:mod:`slurm_burst_lab.gcemeta`). Deleting it halts the VM;
- a control endpoint for the lab's tests (``/_emulator/calls``, ``quotas``, ``spot``,
  ``market``, ``preempt``, ``timeline``, ``clear``).

Where it is simpler than Compute, docs/providers.md says so. Every request is counted
by method (:attr:`GceEmulator.calls`).
"""

from __future__ import annotations

import base64
import ipaddress
import itertools
import json
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from slurm_burst.core.hostkeys import parse_console_host_keys
from slurm_burst_lab.gcemeta import GceMetadata
from slurm_burst_lab.labvms import LabVms
from slurm_burst_lab.loopback import Remote, serve, serve_until_sigterm, shut

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]

PROJECT = "burst-lab"
API = "/compute/v1"
SELF = "https://www.googleapis.com/compute/v1"
REGIONS = {"us-central1": ("us-central1-a", "us-central1-b", "us-central1-c"),
           "europe-west4": ("europe-west4-a", "europe-west4-b")}  # fmt: skip
ZONES = {z: r for r, zs in REGIONS.items() for z in zs}
# machine type -> (vCPUs, MiB, accelerators it comes with)
MACHINE_TYPES = {
    "e2-small": (2, 2048, 0), "n2-standard-2": (2, 8192, 0), "n2-standard-4": (4, 16384, 0),
    "n2-standard-8": (8, 32768, 0), "c2-standard-60": (60, 245760, 0),
    "a2-highgpu-1g": (12, 87040, 1), "a2-highgpu-8g": (96, 696320, 8),
    "g2-standard-4": (4, 16384, 1),
}  # fmt: skip
ACCELERATORS = ("nvidia-tesla-t4", "nvidia-tesla-a100", "nvidia-l4")
DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd")
IMAGES = {  # project -> image name -> family
    PROJECT: {"slurm-burst-node-v1": "slurm-burst-node"},
    "debian-cloud": {"debian-12-bookworm-v20261001": "debian-12"},
}
CAPACITY_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED")
SPOT_MODES = ("", "refuse", "withhold")
POLICY_MOST = 150  # instances in one compact placement policy (Google's documented limit)

# the quota group of each method (docs/scale.md): what scale mode counts
QUOTA_GROUP = {
    "insert": "default", "bulkInsert": "default", "delete": "default",
    "setLabels": "default", "get": "read_requests", "getGuestAttributes": "read_requests",
    "getSerialPortOutput": "read_requests", "list": "list_requests",
    "aggregatedList": "list_requests", "operations.list": "list_requests",
    "operations.get": "operation_read_requests", "operations.wait": "operation_read_requests",
    "resourcePolicies.insert": "default", "resourcePolicies.delete": "default",
    "resourcePolicies.get": "read_requests", "resourcePolicies.list": "list_requests",
}  # fmt: skip


def _now_rfc3339(at: float | None = None) -> str:
    t = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}-00:00"


class ApiError(Exception):
    """An error answer in Compute's form."""

    def __init__(self, http: int, reason: str, message: str, status: str = "") -> None:
        super().__init__(message)
        self.http = http
        self.reason = reason
        self.message = message
        self.status = status or {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED",
                                 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
                                 429: "RESOURCE_EXHAUSTED"}.get(http, "UNKNOWN")  # fmt: skip

    def document(self) -> dict[str, Any]:
        return {"error": {"code": self.http, "message": self.message, "status": self.status,
                          "errors": [{"message": self.message, "domain": "global",
                                      "reason": self.reason}]}}  # fmt: skip


@dataclass
class Quotas:
    """Scale mode's rate quotas: ``limits`` calls per quota group in each ``interval``
    seconds of the wall clock (Compute: 60), an excess answered 403
    ``rateLimitExceeded`` (``status_429`` of them answered 429 instead)."""

    limits: Mapping[str, int]
    interval: float = 60.0
    status_429: float = 0.0  # the share of excess answers that are 429, not 403
    used: dict[tuple[str, int], int] = field(default_factory=dict)
    throttled: Counter[str] = field(default_factory=Counter)
    most: dict[str, int] = field(default_factory=dict)  # the most in one window, by group

    def take(self, group: str, at: float) -> bool:
        limit = self.limits.get(group)
        if limit is None:
            return True
        window = math.floor(at / self.interval)
        key = (group, window)
        if self.used.get(key, 0) >= limit:
            self.throttled[group] += 1
            return False
        self.used[key] = self.used.get(key, 0) + 1
        self.most[group] = max(self.most.get(group, 0), self.used[key])
        for old in [k for k in self.used if k[1] < window - 1]:
            del self.used[old]
        return True

    def most_in_a_window(self) -> dict[str, int]:
        """Since the last clear, the most calls of each group one window held."""
        return dict(self.most)


@dataclass
class Fault:
    method: str
    http: int
    reason: str
    message: str
    times: int


def _zone_url(project: str, zone: str) -> str:
    return f"{SELF}/projects/{project}/zones/{zone}"


def _region_url(project: str, region: str) -> str:
    return f"{SELF}/projects/{project}/regions/{region}"


def _last(url_or_name: str) -> str:
    return str(url_or_name).rstrip("/").rsplit("/", 1)[-1]


class GceEmulator:
    """Compute's API for one project, as a WSGI app; serve with :meth:`start`."""

    def __init__(
        self, project: str = PROJECT, quotas: Quotas | None = None, boot_delay: float = 0.0,
        keys_after: float | None = None,
    ) -> None:  # fmt: skip
        self.project = project
        self.quotas = quotas
        self.boot_delay = boot_delay  # seconds an instance stays STAGING after its insert
        # scale mode: every instance publishes a host key of its own this many seconds
        # after it runs, as Google's guest environment does (None: only what publish says)
        self.keys_after = keys_after
        self.calls: Counter[str] = Counter()
        # scale mode: every call as (wall-clock seconds, method, throttled)
        self.timeline: list[tuple[float, str, bool]] = []
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body): the checks
        self.answers: list[tuple[str, Any]] = []  # (what, answer): the checks
        self.keep_exchanges = False  # keep requests and answers (the discovery checks)
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name)
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}  # by name
        self._by_request: dict[str, str] = {}  # requestId -> operation name
        self.guest: dict[str, dict[str, str]] = {}  # instance name -> hostkeys/ attributes
        self.serial: dict[str, str] = {}  # instance name -> serial port 1 output
        self.room: dict[tuple[str, str], int] = {}  # (machine type, zone) -> instances left
        self.refusal: dict[tuple[str, str], str] = {}  # its code when out of room
        self._faults: list[Fault] = []
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._lock = threading.RLock()
        self._server: Any = None
        self.port = 0
        self.vms: LabVms | None = None  # instances boot as VMs (the lab)
        self.vm_range: ipaddress.IPv4Network | None = None  # their addresses (with vms)
        self.meta = GceMetadata()  # each booted instance's metadata server, in its netns
        self.spot = ""  # Spot capacity: '' normal, refuse, withhold
        self.withheld: set[str] = set()  # Spot instances whose capacity never came (ids)
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}  # (region, name)
        self.members: dict[tuple[str, str], set[str]] = {}  # a policy's instances (ids)
        self.rooms: dict[str, int] = {}  # policy name -> the most instances it takes
        self.policy_delay = 0.0  # seconds a new placement policy takes to be made
        self.preempted: list[str] = []  # instance ids, in order

    # -- control ----------------------------------------------------------------------
    def start(self) -> int:
        self._server = serve(self, "gce-emulator")
        self.port = int(self._server.server_port)
        return self.port

    def stop(self) -> None:
        shut(self._server)
        self._server = None

    def inject(
        self, method: str, http: int, reason: str, message: str = "", times: int = 1
    ) -> None:
        """The next ``times`` calls of ``method`` (``insert``, ``bulkInsert``, ``get``...)
        fail with Compute's error ``reason`` and HTTP status ``http``."""
        with self._lock:
            self._faults.append(Fault(method, http, reason, message or f"injected {reason}",
                                      times))  # fmt: skip

    def limit(self, machine_type: str, zone: str, room: int, code: str = CAPACITY_CODES[0]) -> None:
        """At most ``room`` more instances of ``machine_type`` in ``zone``; past it an
        insert's operation fails with ``code`` (a bulk insert makes what fits, if that
        is at least its ``minCount``)."""
        with self._lock:
            self.room[(machine_type, zone)] = room
            self.refusal[(machine_type, zone)] = code

    def set_spot(self, mode: str) -> None:
        """Spot capacity from now on: normal (''), ``refuse`` or ``withhold``."""
        if mode not in SPOT_MODES:
            raise ValueError(f"spot mode {mode!r}: one of {', '.join(map(repr, SPOT_MODES))}")
        with self._lock:
            self.spot = mode

    def policy_room(self, name: str, instances: int) -> None:
        """Placement policy ``name`` (made or not yet) takes at most ``instances``."""
        with self._lock:
            self.rooms[name] = instances

    def market(self) -> dict[str, Any]:
        """For a test: the placement policies and their instances, the Spot mode, the
        instances withheld (ever) and preempted, the instances that exist now."""
        with self._lock:
            return {"policies": {name: {"region": region, "members": sorted(
                        self.members.get((region, name), set()))}
                                 for (region, name) in self.policies},
                    "spot": self.spot, "withheld": sorted(self.withheld),
                    "preempted": list(self.preempted),
                    "live": sorted(i["id"] for i in self.instances.values())}  # fmt: skip

    def preempt(self, instance: str, seconds: float) -> dict[str, Any]:
        """Preempt ``instance`` (its id or name): its metadata server says so at once,
        and it is deleted (or stopped, as its termination action says) ``seconds``
        later, its VM halted."""
        if not (math.isfinite(seconds) and 0 < seconds <= 3600):
            raise ValueError(f"preempt in {seconds!r} s: 0 < seconds <= 3600")
        with self._lock:
            found = next(((z, n) for (z, n), i in self.instances.items()
                          if instance in (i["id"], n)), None)  # fmt: skip
            if found is None:
                raise ValueError(f"preempt {instance!r}: no such instance")
            inst = self.instances[found]
            self.preempted.append(inst["id"])
        if self.meta.value(inst["id"], "preempted") is not None:
            self.meta.preempt(inst["id"])
        timer = threading.Timer(seconds, self._reclaim, args=found)
        timer.daemon = True
        timer.start()
        return {"instance": inst["id"], "name": found[1], "in": seconds}

    def _reclaim(self, zone: str, name: str) -> None:
        with self._lock:
            inst = self.instances.get((zone, name))
            if inst is None:
                return
            action = (inst.get("scheduling") or {}).get("instanceTerminationAction", "STOP")
            if action == "DELETE":
                self._delete(zone, name, {})
            else:
                inst["status"] = "TERMINATED"
                self._halt(inst)
            self._operation_done("compute.instances.preempted", inst["selfLink"], inst["id"],
                                 zone=zone)  # fmt: skip
        log.info("gceemu.preempted instance=%s action=%s", inst["id"], action)

    def _halt(self, inst: dict[str, Any]) -> None:
        self.meta.stop(inst["id"])
        if self.vms is not None:
            self.vms.halt(inst["id"])

    def publish(self, name: str, host_keys: Iterable[tuple[str, str]] = (),
                serial: str | None = None) -> None:  # fmt: skip
        """What instance ``name``'s guest environment publishes: its host keys in the
        ``hostkeys/`` guest attributes, and (``serial``) its serial port 1 output."""
        with self._lock:
            self.guest[name] = {ktype: body for ktype, body in host_keys}
            if serial is not None:
                self.serial[name] = serial

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()
            self._faults.clear()
            self.room.clear()
            self.rooms.clear()
            self.spot = ""
            self.requests.clear()
            self.answers.clear()
            self.timeline.clear()
            if self.quotas is not None:
                self.quotas.used.clear()
                self.quotas.throttled.clear()
                self.quotas.most.clear()

    # -- WSGI -------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        try:
            if path in ("/token", "/o/oauth2/token"):
                return self._json(start_response, 200, self._token(raw))
            if path.startswith("/_emulator/"):
                return self._json(start_response, 200, self._control(path[11:], query))
            if not path.startswith(f"{API}/projects/"):
                raise ApiError(404, "notFound", f"The requested URL {path} was not found.")
            body = json.loads(raw) if raw else None
            if self.keep_exchanges:
                with self._lock:
                    self.requests.append((method, path, body))
            answer = self._route(method, path[len(f"{API}/projects/") :], query, body)
            return self._json(start_response, 200, answer)
        except ApiError as exc:
            return self._json(start_response, exc.http, exc.document())
        except (ValueError, KeyError, TypeError) as exc:
            err = ApiError(400, "invalid", f"Invalid value: {exc}")
            return self._json(start_response, 400, err.document())

    def _json(self, start_response: StartResponse, http: int, doc: Any) -> list[bytes]:
        data = json.dumps(doc).encode()
        reason = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
                  409: "Conflict", 429: "Too Many Requests"}.get(http, "Error")  # fmt: skip
        start_response(f"{http} {reason}", [("Content-Type", "application/json; charset=UTF-8"),
                                            ("Content-Length", str(len(data)))])  # fmt: skip
        return [data]

    def _token(self, raw: bytes) -> dict[str, Any]:
        """A service account's JWT bearer grant: the assertion's shape is checked (three
        base64url parts, a JSON header and claims naming an issuer and a scope)."""
        form = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            raise ApiError(400, "unsupported_grant_type", "Invalid grant_type")
        parts = form.get("assertion", "").split(".")
        if len(parts) != 3:
            raise ApiError(400, "invalid_grant", "Invalid JWT: not three parts")
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        if not claims.get("iss") or not claims.get("scope"):
            raise ApiError(400, "invalid_grant", "Invalid JWT: no iss or scope")
        self.calls["token"] += 1
        return {"access_token": f"ya29.emulator-{next(self._ids)}", "token_type": "Bearer",
                "expires_in": 3599}  # fmt: skip

    def _control(self, what: str, q: Mapping[str, str]) -> dict[str, Any]:
        """The lab's tests' and the benchmark's switches: ``calls`` (counts by method,
        throttled answers by quota group, the most calls of a group in one window);
        ``quotas?factor=F`` (Compute's default quotas times F from now on; 0: none);
        ``timeline`` (scale mode: every call); ``spot?mode=refuse|withhold|`` (Spot
        capacity); ``market`` (placement policies, Spot mode, withheld and preempted
        instances); ``preempt?instance=ID|NAME&in=S`` (a preemption, the instance gone S
        seconds later); ``clear``."""
        if what == "preempt":
            try:
                return self.preempt(q.get("instance", ""), float(q.get("in", "30")))
            except ValueError as exc:
                raise ApiError(400, "invalid", str(exc)) from None
        if what == "market":
            return self.market()
        with self._lock:
            if what == "timeline":
                return {"timeline": list(self.timeline)}
            if what == "spot":
                try:
                    self.set_spot(q.get("mode", ""))
                except ValueError as exc:
                    raise ApiError(400, "invalid", str(exc)) from None
                return self.market()
            if what == "clear":
                self.clear()
            elif what == "quotas":
                factor = float(q.get("factor", "0"))
                if not (math.isfinite(factor) and 0 <= factor < 1e6):
                    raise ApiError(400, "invalid", f"quotas factor {q.get('factor')!r}")
                self.quotas = scaled_quotas(factor) if factor else None
            elif what != "calls":
                raise ApiError(404, "notFound", f"no emulator control {what!r}")
            quotas = self.quotas
            return {"calls": dict(self.calls),
                    "throttled": dict(quotas.throttled) if quotas else {},
                    "most_in_a_window": quotas.most_in_a_window() if quotas else {}}  # fmt: skip

    # -- routing ------------------------------------------------------------------------
    def _route(self, method: str, rest: str, q: dict[str, str], body: Any) -> Any:
        project, _, rest = rest.partition("/")
        parts = rest.split("/")
        if project != self.project:
            if method == "GET" and parts[:2] == ["global", "images"] and project in IMAGES:
                return self._images(project, parts[2:])
            raise ApiError(404, "notFound", f"The resource 'projects/{project}' was not found")
        match parts:
            case ["zones"]:
                return self._count(
                    "list",
                    lambda: self._list_of(
                        "compute#zoneList",
                        [self._zone(z) for z in ZONES],
                        f"projects/{project}/zones",
                    ),
                )
            case ["zones", zone]:
                return self._count("get", lambda: self._zone(zone))
            case ["regions"]:
                return self._count(
                    "list",
                    lambda: self._list_of(
                        "compute#regionList",
                        [self._region(r) for r in REGIONS],
                        f"projects/{project}/regions",
                    ),
                )
            case ["regions", region]:
                return self._count("get", lambda: self._region(region))
            case ["zones", zone, "machineTypes", name]:
                return self._count("get", lambda: self._machine_type(zone, name))
            case ["zones", zone, "machineTypes"]:
                return self._count(
                    "list",
                    lambda: self._list_of(
                        "compute#machineTypeList",
                        [self._machine_type(zone, m) for m in MACHINE_TYPES],
                        f"projects/{project}/zones/{zone}/machineTypes",
                    ),
                )
            case ["zones", zone, "diskTypes", name]:
                return self._count("get", lambda: self._disk_type(zone, name))
            case ["zones", zone, "acceleratorTypes", name]:
                return self._count("get", lambda: self._accelerator(zone, name))
            case ["global", "networks", name]:
                return self._count("get", lambda: self._network(name))
            case ["regions", region, "subnetworks", name]:
                return self._count("get", lambda: self._subnetwork(region, name))
            case ["global", "images", *more]:
                return self._images(project, more)
            case ["zones", zone, "instances"] if method == "POST":
                return self._count("insert", lambda: self._insert(zone, body, q), mutation=True)
            case ["zones", zone, "instances", "bulkInsert"] if method == "POST":
                return self._count("bulkInsert", lambda: self._bulk(zone, None, body, q),
                                   mutation=True)  # fmt: skip
            case ["regions", region, "instances", "bulkInsert"] if method == "POST":
                return self._count("bulkInsert", lambda: self._bulk(None, region, body, q),
                                   mutation=True)  # fmt: skip
            case ["zones", zone, "instances"]:
                return self._count("list", lambda: self._list_instances(zone, q))
            case ["aggregated", "instances"]:
                return self._count("aggregatedList", lambda: self._aggregated("instances", q))
            case ["aggregated", "disks"]:
                return self._count("aggregatedList", lambda: self._aggregated("disks", q))
            case ["aggregated", "operations"]:
                return self._count("operations.list", lambda: self._aggregated("operations", q))
            case ["zones", zone, "disks", name]:
                return self._count("get", lambda: self._disk(zone, name))
            case ["zones", zone, "instances", name] if method == "DELETE":
                return self._count("delete", lambda: self._delete(zone, name, q), mutation=True)
            case ["zones", zone, "instances", name]:
                return self._count("get", lambda: self._instance(zone, name))
            case ["zones", zone, "instances", name, "setLabels"] if method == "POST":
                return self._count("setLabels", lambda: self._set_labels(zone, name, body, q),
                                   mutation=True)  # fmt: skip
            case ["zones", zone, "instances", name, "getGuestAttributes"]:
                return self._count("getGuestAttributes", lambda: self._guest(zone, name, q))
            case ["zones", zone, "instances", name, "serialPort"]:
                return self._count("getSerialPortOutput", lambda: self._serial(zone, name, q))
            case ["regions", region, "resourcePolicies"] if method == "POST":
                return self._count(
                    "resourcePolicies.insert",
                    lambda: self._policy_insert(region, body, q),
                    mutation=True,
                )
            case ["regions", region, "resourcePolicies"]:
                return self._count("resourcePolicies.list", lambda: self._policy_list(region, q))
            case ["regions", region, "resourcePolicies", name] if method == "DELETE":
                return self._count(
                    "resourcePolicies.delete",
                    lambda: self._policy_delete(region, name, q),
                    mutation=True,
                )
            case ["regions", region, "resourcePolicies", name]:
                return self._count("resourcePolicies.get", lambda: self._policy(region, name))
            case [("zones" | "regions"), where, "operations"]:
                return self._count("operations.list", lambda: self._operations(where, q))
            case [("zones" | "regions" | "global"), *_, "operations", name, "wait"]:
                self._wait_for(name)
                return self._count("operations.wait", lambda: self._operation(name))
            case [("zones" | "regions" | "global"), *_, "operations", name]:
                return self._count("operations.get", lambda: self._operation(name))
        raise ApiError(404, "notFound", f"The requested URL {API}/projects/{project}/{rest} "
                                        "was not found.")  # fmt: skip

    def _count(self, method: str, answer: Callable[[], Any], mutation: bool = False) -> Any:
        with self._lock:
            self.calls[method] += 1
            now = time.time()
            limited = self.quotas is not None and not self.quotas.take(
                QUOTA_GROUP.get(method, "default"), now)  # fmt: skip
            if self.quotas is not None:
                self.timeline.append((now, method, limited))
            if self.quotas is not None and limited:
                shown = 429 if self.quotas.status_429 and (
                    self.quotas.throttled[QUOTA_GROUP.get(method, "default")]
                    % max(1, round(1 / self.quotas.status_429)) == 0
                ) else 403  # fmt: skip
                raise ApiError(shown, "rateLimitExceeded",
                               "Quota exceeded for quota metric 'Queries' and limit 'Queries "
                               f"per minute' of service 'compute.googleapis.com' for consumer "
                               f"'project_number:{self.project}'.")  # fmt: skip
            for f in self._faults:
                if f.method == method and f.times > 0:
                    f.times -= 1
                    raise ApiError(f.http, f.reason, f.message)
            got = answer()
        if self.keep_exchanges:
            with self._lock:
                self.answers.append((method, got))
        return got

    # -- the catalogue --------------------------------------------------------------------
    def _list_of(self, kind: str, items: list[dict[str, Any]], path: str) -> dict[str, Any]:
        return {"kind": kind, "id": path, "items": items, "selfLink": f"{SELF}/{path}"}

    def _zone(self, zone: str) -> dict[str, Any]:
        if zone not in ZONES:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/"
                                            f"{zone}' was not found")  # fmt: skip
        return {"kind": "compute#zone", "id": str(2000 + sorted(ZONES).index(zone)),
                "creationTimestamp": "2014-05-30T18:35:16.575-07:00", "name": zone,
                "description": zone, "status": "UP",
                "region": _region_url(self.project, ZONES[zone]),
                "selfLink": _zone_url(self.project, zone), "availableCpuPlatforms":
                ["Intel Cascade Lake", "AMD Milan"], "supportsPzs": False}  # fmt: skip

    def _region(self, region: str) -> dict[str, Any]:
        if region not in REGIONS:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/regions/"
                                            f"{region}' was not found")  # fmt: skip
        return {"kind": "compute#region", "id": str(1000 + sorted(REGIONS).index(region)),
                "creationTimestamp": "2014-05-30T18:35:16.575-07:00", "name": region,
                "description": region, "status": "UP",
                "zones": [_zone_url(self.project, z) for z in REGIONS[region]],
                "quotas": [], "selfLink": _region_url(self.project, region),
                "supportsPzs": False}  # fmt: skip

    def _machine_type(self, zone: str, name: str) -> dict[str, Any]:
        self._zone(zone)
        if name not in MACHINE_TYPES:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}"
                                            f"/machineTypes/{name}' was not found")  # fmt: skip
        cpus, mem, gpus = MACHINE_TYPES[name]
        doc: dict[str, Any] = {
            "kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12),
            "creationTimestamp": "2015-01-16T09:25:43.314-08:00", "name": name,
            "description": f"{cpus} vCPUs, {mem // 1024} GB RAM", "guestCpus": cpus,
            "memoryMb": mem, "imageSpaceGb": 0, "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168", "zone": zone,
            "selfLink": f"{_zone_url(self.project, zone)}/machineTypes/{name}",
            "isSharedCpu": name.startswith("e2-small"),
        }  # fmt: skip
        if gpus:
            doc["accelerators"] = [{"guestAcceleratorType": "nvidia-tesla-a100",
                                    "guestAcceleratorCount": gpus}]  # fmt: skip
        return doc

    def _disk_type(self, zone: str, name: str) -> dict[str, Any]:
        self._zone(zone)
        if name not in DISK_TYPES:
            raise ApiError(404, "notFound", f"diskType {name} was not found")
        return {"kind": "compute#diskType", "id": str(3000 + DISK_TYPES.index(name)),
                "creationTimestamp": "2014-06-02T11:07:28.530-07:00", "name": name,
                "description": name, "validDiskSize": "10GB-65536GB", "zone":
                _zone_url(self.project, zone), "defaultDiskSizeGb": "10",
                "selfLink": f"{_zone_url(self.project, zone)}/diskTypes/{name}"}  # fmt: skip

    def _accelerator(self, zone: str, name: str) -> dict[str, Any]:
        self._zone(zone)
        if name not in ACCELERATORS:
            raise ApiError(404, "notFound", f"acceleratorType {name} was not found")
        return {"kind": "compute#acceleratorType", "id": str(4000 + ACCELERATORS.index(name)),
                "creationTimestamp": "2017-01-01T00:00:00.000-08:00", "name": name,
                "description": name, "zone": _zone_url(self.project, zone),
                "maximumCardsPerInstance": 8,
                "selfLink": f"{_zone_url(self.project, zone)}/acceleratorTypes/{name}"}  # fmt: skip

    def _network(self, name: str) -> dict[str, Any]:
        if name != "default":
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/global/"
                                            f"networks/{name}' was not found")  # fmt: skip
        return {"kind": "compute#network", "id": "5000", "name": "default",
                "creationTimestamp": "2014-05-30T18:35:16.575-07:00",
                "autoCreateSubnetworks": True,
                "selfLink": f"{SELF}/projects/{self.project}/global/networks/default"}  # fmt: skip

    def _subnetwork(self, region: str, name: str) -> dict[str, Any]:
        self._region(region)
        return {"kind": "compute#subnetwork", "id": "5100", "name": name,
                "creationTimestamp": "2014-05-30T18:35:16.575-07:00",
                "network": f"{SELF}/projects/{self.project}/global/networks/default",
                "ipCidrRange": "10.251.0.0/24", "gatewayAddress": "10.251.0.1",
                "region": _region_url(self.project, region),
                "selfLink": f"{_region_url(self.project, region)}/subnetworks/{name}"}  # fmt: skip

    def _images(self, project: str, rest: list[str]) -> dict[str, Any]:
        if rest:
            return self._count("get", lambda: self._image(project, rest))  # type: ignore[no-any-return]
        return self._count(  # type: ignore[no-any-return]
            "list", lambda: self._list_of("compute#imageList",
                                          [self._image(project, [n]) for n in IMAGES[project]],
                                          f"projects/{project}/global/images"))  # fmt: skip

    def _image(self, project: str, rest: list[str]) -> dict[str, Any]:
        images = IMAGES.get(project, {})
        if rest[:1] == ["family"] and len(rest) == 2:
            names = [n for n, fam in images.items() if fam == rest[1]]
        elif len(rest) == 1:
            names = [rest[0]] if rest[0] in images else []
        else:
            names = []
        if not names:
            raise ApiError(404, "notFound", f"The resource 'projects/{project}/global/images/"
                                            f"{'/'.join(rest)}' was not found")  # fmt: skip
        name = names[-1]
        return {"kind": "compute#image", "id": str(6000 + len(name)), "name": name,
                "creationTimestamp": "2026-10-01T00:00:00.000-07:00", "family": images[name],
                "status": "READY", "sourceType": "RAW", "diskSizeGb": "10",
                "archiveSizeBytes": "1000000000",
                "selfLink": f"{SELF}/projects/{project}/global/images/{name}"}  # fmt: skip

    # -- instances ------------------------------------------------------------------------
    NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")

    def _instance(self, zone: str, name: str) -> dict[str, Any]:
        self._zone(zone)
        inst = self.instances.get((zone, name))
        if inst is None:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}"
                                            f"/instances/{name}' was not found")  # fmt: skip
        return self._shown(inst)

    def _shown(self, inst: dict[str, Any]) -> dict[str, Any]:
        """The instance as read now: STAGING until its boot delay has passed."""
        out = {k: v for k, v in inst.items() if not k.startswith("_")}
        made = inst["_made"]
        if inst.get("_withheld"):  # Spot capacity that does not come: STAGING for good
            return out
        if out["status"] == "STAGING" and time.time() >= made + self.boot_delay:
            inst["status"] = out["status"] = "RUNNING"
            inst["lastStartTimestamp"] = out["lastStartTimestamp"] = _now_rfc3339()
        return out

    def _new_instance(self, zone: str, name: str, props: Mapping[str, Any]) -> dict[str, Any]:
        """Instance ``name`` from the insert's (or a bulk insert's) properties; its boot
        disk is made with it."""
        if not self.NAME.fullmatch(name):
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'. "
                                           "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}"
                                           "[a-z0-9])?)'")  # fmt: skip
        mtype = _last(props.get("machineType", ""))
        self._machine_type(zone, mtype)
        disks = []
        for i, d in enumerate(props.get("disks") or []):
            init = d.get("initializeParams") or {}
            dname = init.get("diskName") or (name if d.get("boot") else f"{name}-{i}")
            size = str(init.get("diskSizeGb") or 10)
            self.disks[(zone, dname)] = {
                "kind": "compute#disk", "id": str(next(self._ids)), "name": dname,
                "creationTimestamp": _now_rfc3339(), "sizeGb": size, "status": "READY",
                "zone": _zone_url(self.project, zone),
                "type": init.get("diskType") or f"{_zone_url(self.project, zone)}/diskTypes/"
                "pd-standard", "sourceImage": init.get("sourceImage", ""),
                "users": [f"{_zone_url(self.project, zone)}/instances/{name}"],
                "selfLink": f"{_zone_url(self.project, zone)}/disks/{dname}",
            }  # fmt: skip
            disks.append({"kind": "compute#attachedDisk", "type": "PERSISTENT",
                          "mode": d.get("mode", "READ_WRITE"), "index": i,
                          "source": f"{_zone_url(self.project, zone)}/disks/{dname}",
                          "deviceName": d.get("deviceName") or dname,
                          "boot": bool(d.get("boot")), "autoDelete": bool(d.get("autoDelete",
                                                                                    True)),
                          "interface": "SCSI", "diskSizeGb": size})  # fmt: skip
        nics = []
        network = f"{SELF}/projects/{self.project}/global/networks/default"
        subnet = f"{_region_url(self.project, ZONES[zone])}/subnetworks/default"
        for i, nic in enumerate(props.get("networkInterfaces") or [{}]):
            nics.append({
                "kind": "compute#networkInterface", "name": f"nic{i}",
                "network": nic.get("network") or network,
                "subnetwork": nic.get("subnetwork") or subnet,
                "networkIP": self._address(),
                "fingerprint": "nicfp0000=", "stackType": "IPV4_ONLY",
            })  # fmt: skip
        inst: dict[str, Any] = {
            "kind": "compute#instance", "id": str(next(self._ids)), "name": name,
            "creationTimestamp": _now_rfc3339(), "description": props.get("description", ""),
            "tags": {"items": list((props.get("tags") or {}).get("items") or []),
                     "fingerprint": "tagfp0000="},
            "machineType": f"{_zone_url(self.project, zone)}/machineTypes/{mtype}",
            "status": "STAGING" if self.boot_delay > 0 else "RUNNING",
            "zone": _zone_url(self.project, zone), "canIpForward": False,
            "networkInterfaces": nics, "disks": disks,
            "metadata": {"kind": "compute#metadata", "fingerprint": "mdfp0000=",
                         "items": list((props.get("metadata") or {}).get("items") or [])},
            "serviceAccounts": list(props.get("serviceAccounts") or []),
            "selfLink": f"{_zone_url(self.project, zone)}/instances/{name}",
            "scheduling": dict(props.get("scheduling") or {"onHostMaintenance": "MIGRATE",
                                                             "automaticRestart": True,
                                                             "preemptible": False}),
            "cpuPlatform": "Intel Cascade Lake", "labels": dict(props.get("labels") or {}),
            "labelFingerprint": f"lbl{next(self._ids) % 10**6:06d}=",
            "startRestricted": False, "deletionProtection": False,
            "fingerprint": "instfp000=", "lastStartTimestamp": _now_rfc3339(),
            "_made": time.time(),
        }  # fmt: skip
        if props.get("guestAccelerators"):
            inst["guestAccelerators"] = list(props["guestAccelerators"])
        if props.get("resourcePolicies"):
            inst["resourcePolicies"] = list(props["resourcePolicies"])
        for policy in self._policies_of(zone, props):
            self.members.setdefault(policy, set()).add(inst["id"])
        self.instances[(zone, name)] = inst
        if _is_spot(props) and self.spot == "withhold":  # made, and never runs
            inst["_withheld"], inst["status"] = True, "STAGING"
            self.withheld.add(inst["id"])
        elif self.vms is not None:
            self._boot(inst)
        return inst

    def _address(self) -> str:
        """A new instance's internal IP: with booting, the lowest of the range no live
        instance holds (Compute reuses a deleted instance's address too); else one more."""
        if self.vm_range is None:
            n = len(self.instances)
            return f"10.251.{(n // 250) % 250}.{n % 250 + 2}"
        held = {nic["networkIP"] for inst in self.instances.values()
                for nic in inst["networkInterfaces"]}  # fmt: skip
        for host in list(self.vm_range.hosts())[1:]:  # the first is the range's gateway
            if str(host) not in held:
                return str(host)
        raise ApiError(400, "IP_SPACE_EXHAUSTED",
                       f"Subnetwork range {self.vm_range} has no free address")  # fmt: skip

    def _boot(self, inst: dict[str, Any]) -> None:
        """The instance's VM: its startup script, the ``ssh-keys`` of its metadata as
        root's authorized keys, its boot disk's image (as the lab maps images)."""
        assert self.vms is not None
        meta = {i.get("key"): str(i.get("value", "")) for i in inst["metadata"]["items"]}
        keys = tuple(line.partition(":")[2].strip()
                     for line in meta.get("ssh-keys", "").splitlines() if ":" in line)  # fmt: skip
        boot = next((d for d in inst["disks"] if d.get("boot")), None)
        image = _last(self.disks.get((_last(inst["zone"]), _last(boot["source"])), {})
                      .get("sourceImage", "")) if boot else ""  # fmt: skip
        self.vms.boot(inst["id"], inst["networkInterfaces"][0]["networkIP"],
                      meta.get("startup-script") or None, tuple(k for k in keys if k), image,
                      hostname=inst["name"])  # fmt: skip
        self.meta.add(inst["id"], inst["name"], _last(inst["zone"]))
        self.meta.serve(inst["id"], self.vms.netns_of(inst["id"]))

    def _room_for(self, mtype: str, zone: str, props: Mapping[str, Any] | None = None) -> float:
        """How many more instances of ``mtype`` fit in ``zone`` with these properties:
        the zone's room, none while Spot capacity is refused, a placement policy's."""
        room = self.room.get((mtype, zone), math.inf)
        if props is not None and _is_spot(props) and self.spot == "refuse":
            return 0
        for region, name in self._policies_of(zone, props or {}):
            held = len(self.members.get((region, name), set()))
            room = min(room, self.rooms.get(name, POLICY_MOST) - held)
        return max(0, room)

    def _policies_of(self, zone: str, props: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The placement policies an instance's properties name, checked as Compute
        checks them: made, in the zone's region, the instance not live-migrated."""
        out = []
        for link in props.get("resourcePolicies") or []:
            parts = str(link).rstrip("/").split("/")
            region, name = (parts[-3] if len(parts) >= 3 else ZONES[zone]), parts[-1]
            if time.time() < self.policies.get((region, name), {}).get("_ready_at", 0.0):
                raise ApiError(400, "resourceNotReady", f"The resource 'projects/{self.project}"
                                                        f"/regions/{region}/resourcePolicies/"
                                                        f"{name}' is not ready")  # fmt: skip
            if (region, name) not in self.policies:
                raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/regions/"
                                                f"{region}/resourcePolicies/{name}' was not "
                                                "found")  # fmt: skip
            if region != ZONES[zone]:
                raise ApiError(
                    400,
                    "invalid",
                    f"Resource policy '{name}' is in region "
                    f"{region}, not the instance's ({ZONES[zone]})",
                )
            sched = props.get("scheduling") or {}
            if sched.get("onHostMaintenance") != "TERMINATE":
                raise ApiError(400, "invalid", "Compact placement policies are not supported "
                                               "with live migration: set scheduling."
                                               "onHostMaintenance to TERMINATE")  # fmt: skip
            out.append((region, name))
        return out

    def _take_room(self, mtype: str, zone: str, n: int) -> None:
        if (mtype, zone) in self.room:
            self.room[(mtype, zone)] -= n

    def _created(self, body: Any, q: Mapping[str, str]) -> dict[str, Any] | None:
        """A create's first checks: its resource named; the operation a request with
        this ``requestId`` made already (None: a new request)."""
        if not isinstance(body, dict) or not body.get("name"):
            raise ApiError(400, "required", "Required field 'resource.name' not specified")
        return self._repeated(q)

    def _insert(self, zone: str, body: Any, q: Mapping[str, str]) -> dict[str, Any]:
        self._zone(zone)
        again = self._created(body, q)
        if again is not None:
            return again
        name = str(body["name"])
        if (zone, name) in self.instances:
            where = f"projects/{self.project}/zones/{zone}/instances/{name}"
            raise ApiError(409, "alreadyExists", f"The resource '{where}' already exists")
        mtype = _last(body.get("machineType", ""))
        target = f"{_zone_url(self.project, zone)}/instances/{name}"
        if self._room_for(mtype, zone, body) < 1:
            code = self.refusal.get((mtype, zone), CAPACITY_CODES[0])
            return self._as_started(self._operation_done(
                "insert", target, "", zone=zone, q=q,
                errors=[{"code": code, "message": f"The zone 'projects/{self.project}/zones/"
                         f"{zone}' does not have enough resources available to fulfill the "
                         "request. Try a different zone, or try again later."}],
            ))  # fmt: skip
        self._take_room(mtype, zone, 1)
        inst = self._new_instance(zone, name, body)
        return self._as_started(self._operation_done("insert", target, inst["id"], zone=zone, q=q))

    def _bulk(self, zone: str | None, region: str | None, body: Any, q: Mapping[str, str]
              ) -> dict[str, Any]:  # fmt: skip
        """``instances.bulkInsert`` (zonal) or ``regionInstances.bulkInsert``: ``count``
        instances named by ``perInstanceProperties`` (or ``namePattern``), at least
        ``minCount`` or none; a regional one in the zones its ``locationPolicy`` allows,
        all in one zone if its target shape is ``ANY_SINGLE_ZONE``."""
        if not isinstance(body, dict):
            raise ApiError(400, "required", "Required field 'resource' not specified")
        again = self._repeated(q)
        if again is not None:
            return again
        if zone is not None:
            self._zone(zone)
            zones = [zone]
        else:
            assert region is not None
            self._region(region)
            policy = body.get("locationPolicy") or {}
            allowed = {_last(k): (v or {}).get("preference", "ALLOW")
                       for k, v in (policy.get("locations") or {}).items()}  # fmt: skip
            zones = [z for z in REGIONS[region] if allowed.get(z, "ALLOW" if not allowed
                                                               else "DENY") == "ALLOW"]  # fmt: skip
        props = body.get("instanceProperties") or {}
        mtype = _last(props.get("machineType", ""))
        if not mtype:
            raise ApiError(400, "required", "Required field 'instanceProperties.machineType' "
                                            "not specified")  # fmt: skip
        per = body.get("perInstanceProperties") or {}
        count = int(body.get("count") or len(per))
        min_count = int(body.get("minCount") or count)
        names = list(per)
        pattern = body.get("namePattern") or ""
        if len(names) < count:
            if not pattern or "#" not in pattern:
                raise ApiError(400, "invalid", "Invalid value for field 'resource.count': "
                                               f"'{count}'. More than the names given")  # fmt: skip
            width = pattern.count("#")
            stem = pattern.replace("#" * width, "{:0" + str(width) + "d}")
            i = 1
            while len(names) < count:
                candidate = stem.format(i)
                if candidate not in names:
                    names.append(candidate)
                i += 1
        if not 1 <= min_count <= count <= 5000:
            raise ApiError(400, "invalid", f"Invalid count {count} or minCount {min_count}")
        existing = [n for n in names if any((z, n) in self.instances for z in ZONES)]
        wanted = [n for n in names if n not in existing]
        # where they go: one zone (a single-zone shape, or a zonal call), else spread
        single = zone is not None or (body.get("locationPolicy") or {}).get(
            "targetShape") == "ANY_SINGLE_ZONE"  # fmt: skip
        placed: list[tuple[str, str]] = []
        if single:
            best = max(zones, key=lambda z: min(self._room_for(mtype, z, props), len(wanted)),
                       default=None)  # fmt: skip
            if best is not None:
                fit = int(min(self._room_for(mtype, best, props), len(wanted)))
                placed = [(best, n) for n in wanted[:fit]]
        else:
            left = list(wanted)
            for z in zones:
                fit = int(min(self._room_for(mtype, z, props), len(left)))
                placed += [(z, n) for n in left[:fit]]
                left = left[fit:]
        where = zone or region or ""
        scope = {"zone": zone} if zone else {"region": region}
        target = (f"{_zone_url(self.project, zone)}/instances" if zone
                  else f"{_region_url(self.project, str(region))}/instances")  # fmt: skip
        group = f"og-{next(self._ids)}"
        errors = [{"code": "RESOURCE_ALREADY_EXISTS",
                   "message": f"The resource 'projects/{self.project}/zones/.../instances/{n}' "
                              "already exists"} for n in existing]  # fmt: skip
        made_count = len(existing) + len(placed)
        if made_count < min_count:
            code = self.refusal.get((mtype, zones[0] if zones else ""), CAPACITY_CODES[0])
            errors.append({"code": code, "message": f"Requested minimum count of {min_count} VMs "
                           f"could not be created in {where}: {made_count} fit"})  # fmt: skip
            op = self._operation_done("bulkInsert", target, "", q=q, errors=errors,
                                      group=group, **scope)  # fmt: skip
            return self._as_started(op)
        made: dict[str, int] = {}
        for z, n in placed:
            self._take_room(mtype, z, 1)
            inst = self._new_instance(z, n, {**props, "name": n})
            self._operation_done("insert", f"{_zone_url(self.project, z)}/instances/{n}",
                                 inst["id"], zone=z, group=group)  # fmt: skip
            made[z] = made.get(z, 0) + 1
        short = zones[0] if zones else ""
        code = self.refusal.get((mtype, short), CAPACITY_CODES[0])
        why = [{"code": code, "message": f"The zone 'projects/{self.project}/zones/{short}' "
                "does not have enough resources available to fulfill the request."}]  # fmt: skip
        for n in [n for n in wanted if n not in {p for _, p in placed}]:  # each its error
            self._operation_done("insert", f"{_zone_url(self.project, short)}/instances/{n}", "",
                                 zone=short, group=group, errors=why)  # fmt: skip
        op = self._operation_done("bulkInsert", target, "", q=q, group=group,
                                  errors=errors or None, **scope)  # fmt: skip
        op["instancesBulkInsertOperationMetadata"] = {"perLocationStatus": {
            f"zones/{z}": {"status": "DONE", "targetVmCount": len(wanted),
                           "createdVmCount": n, "failedToCreateVmCount": 0,
                           "deletedVmCount": 0} for z, n in made.items()}}  # fmt: skip
        return self._as_started(op)

    def _delete(self, zone: str, name: str, q: Mapping[str, str]) -> dict[str, Any]:
        self._instance(zone, name)
        again = self._repeated(q)
        if again is not None:
            return again
        inst = self.instances.pop((zone, name))
        for d in inst["disks"]:
            if d.get("autoDelete"):
                self.disks.pop((zone, _last(d["source"])), None)
        mtype = _last(inst["machineType"])
        if (mtype, zone) in self.room:
            self.room[(mtype, zone)] += 1
        self.guest.pop(name, None)
        self.serial.pop(name, None)
        for members in self.members.values():
            members.discard(inst["id"])
        self._halt(inst)
        return self._operation_done("delete", inst["selfLink"], inst["id"], zone=zone, q=q)

    def _set_labels(self, zone: str, name: str, body: Any, q: Mapping[str, str]) -> dict[str, Any]:
        self._instance(zone, name)
        inst = self.instances[(zone, name)]
        fp = (body or {}).get("labelFingerprint")
        if fp is not None and fp != inst["labelFingerprint"]:
            raise ApiError(412, "conditionNotMet", "Labels fingerprint either invalid or "
                                                   "resource labels have changed")  # fmt: skip
        inst["labels"] = dict((body or {}).get("labels") or {})
        inst["labelFingerprint"] = f"lbl{next(self._ids) % 10**6:06d}="
        return self._operation_done("setLabels", inst["selfLink"], inst["id"], zone=zone, q=q)

    def _disk(self, zone: str, name: str) -> dict[str, Any]:
        disk = self.disks.get((zone, name))
        if disk is None:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}"
                                            f"/disks/{name}' was not found")  # fmt: skip
        return disk

    def _list_instances(self, zone: str, q: Mapping[str, str]) -> dict[str, Any]:
        self._zone(zone)
        rows = [self._shown(i) for (z, _), i in sorted(self.instances.items()) if z == zone]
        page, token = self._page([r for r in rows if matches(q.get("filter", ""), r)], q)
        out: dict[str, Any] = {
            "kind": "compute#instanceList", "id": f"projects/{self.project}/zones/{zone}/instances",
            "items": page, "selfLink": f"{_zone_url(self.project, zone)}/instances",
        }  # fmt: skip
        if token:
            out["nextPageToken"] = token
        return out

    def _aggregated(self, what: str, q: Mapping[str, str]) -> dict[str, Any]:
        """``aggregatedList``: every zone's, in pages of ``maxResults`` (500 at most)."""
        if what == "instances":
            rows = [(f"zones/{z}", self._shown(i)) for (z, _), i in sorted(self.instances.items())]
        elif what == "operations":  # zonal and regional ones (global: none made here)
            rows = [(f"zones/{_last(op['zone'])}" if op.get("zone") else
                     f"regions/{_last(op.get('region', ''))}", self._op_now(op))
                    for op in self.operations.values()]  # fmt: skip
        else:
            rows = [(f"zones/{z}", d) for (z, _), d in sorted(self.disks.items())]
        rows = [(z, r) for z, r in rows if matches(q.get("filter", ""), r)]
        page, token = self._page(rows, q)
        items: dict[str, Any] = {}
        for scope in [f"zones/{z}" for z in sorted(ZONES)] + (
            [f"regions/{r}" for r in sorted(REGIONS)] if what == "operations" else []
        ):
            mine = [r for zz, r in page if zz == scope]
            items[scope] = (
                {what: mine} if mine else
                {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results "
                             "for scope '" + scope + "' on this page.",
                             "data": [{"key": "scope", "value": scope}]}}
            )  # fmt: skip
        kind = {"instances": "compute#instanceAggregatedList",
                "operations": "compute#operationAggregatedList"}.get(
                    what, "compute#diskAggregatedList")  # fmt: skip
        out: dict[str, Any] = {
            "kind": kind, "id": f"projects/{self.project}/aggregated/{what}", "items": items,
            "selfLink": f"{SELF}/projects/{self.project}/aggregated/{what}",
        }  # fmt: skip
        if token:
            out["nextPageToken"] = token
        return out

    @staticmethod
    def _page(rows: list[Any], q: Mapping[str, str]) -> tuple[list[Any], str]:
        size = min(500, int(q.get("maxResults") or 500))
        if size < 1:
            raise ApiError(400, "invalid", f"Invalid value for field 'maxResults': '{size}'")
        start = int(q.get("pageToken") or 0)
        page = rows[start : start + size]
        return page, str(start + size) if start + size < len(rows) else ""

    def _guest(self, zone: str, name: str, q: Mapping[str, str]) -> dict[str, Any]:
        self._instance(zone, name)
        path = q.get("queryPath", "")
        attrs = self.guest.get(name)
        inst = self.instances[(zone, name)]
        keys_at = inst["_made"] + self.boot_delay + (self.keys_after or 0.0)
        if not attrs and self.keys_after is not None and time.time() >= keys_at:
            attrs = {"ssh-ed25519": scale_key(inst["id"])}
        if not attrs and self.vms is not None:  # what the guest environment publishes
            attrs = dict(parse_console_host_keys(self.vms.console(inst["id"]) or ""))
        if path != "hostkeys/" or not attrs:
            raise ApiError(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}"
                                            f"/instances/{name}' guest attributes under "
                                            f"'{path}' were not found")  # fmt: skip
        return {"kind": "compute#guestAttributes", "queryPath": path,
                "queryValue": {"items": [{"namespace": "hostkeys", "key": k, "value": v}
                                         for k, v in sorted(attrs.items())]},
                "selfLink": f"{_zone_url(self.project, zone)}/instances/{name}/"
                            f"getGuestAttributes?queryPath={path}"}  # fmt: skip

    def _serial(self, zone: str, name: str, q: Mapping[str, str]) -> dict[str, Any]:
        self._instance(zone, name)
        if q.get("port", "1") != "1":
            raise ApiError(400, "invalid", "Only serial port 1 is served by the emulator")
        text = self.serial.get(name, "")
        if not text and self.vms is not None:
            text = self.vms.console(self.instances[(zone, name)]["id"]) or ""
        start = max(0, int(q.get("start") or 0))
        return {"kind": "compute#serialPortOutput", "contents": text[start:], "start": str(start),
                "next": str(len(text)), "selfLink": f"{_zone_url(self.project, zone)}/instances/"
                f"{name}/serialPort"}  # fmt: skip

    # -- resource policies (compact placement) --------------------------------------------
    def _policy(self, region: str, name: str) -> dict[str, Any]:
        return {k: v for k, v in self._policy_doc(region, name).items() if k[0] != "_"}

    def _policy_doc(self, region: str, name: str) -> dict[str, Any]:
        self._region(region)
        doc = self.policies.get((region, name))
        if doc is None:
            raise ApiError(
                404,
                "notFound",
                f"The resource 'projects/{self.project}/regions/"
                f"{region}/resourcePolicies/{name}' was not found",
            )
        return doc

    def _policy_insert(self, region: str, body: Any, q: Mapping[str, str]) -> dict[str, Any]:
        self._region(region)
        again = self._created(body, q)
        if again is not None:
            return again
        name = str(body["name"])
        if not self.NAME.fullmatch(name):
            raise ApiError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
        placement = body.get("groupPlacementPolicy") or {}
        if placement.get("collocation") not in ("COLLOCATED", "UNSPECIFIED_COLLOCATION", None):
            raise ApiError(
                400,
                "invalid",
                "Invalid value for field 'resource.groupPlacement"
                f"Policy.collocation': '{placement.get('collocation')}'",
            )
        if (region, name) in self.policies:
            raise ApiError(409, "alreadyExists", f"The resource 'projects/{self.project}/regions/"
                                                 f"{region}/resourcePolicies/{name}' already "
                                                 "exists")  # fmt: skip
        link = f"{_region_url(self.project, region)}/resourcePolicies/{name}"
        ready = time.time() + self.policy_delay
        self.policies[(region, name)] = {"_ready_at": ready,
            "kind": "compute#resourcePolicy", "id": str(next(self._ids)), "name": name,
            "creationTimestamp": _now_rfc3339(), "description": body.get("description", ""),
            "region": _region_url(self.project, region), "selfLink": link, "status": "READY",
            "groupPlacementPolicy": dict(placement),
        }  # fmt: skip
        op = self._operation_done("insert", link, self.policies[(region, name)]["id"],
                                  region=region, q=q)  # fmt: skip
        if self.policy_delay > 0:
            op["_done_at"] = ready
        return self._as_started(op)  # fmt: skip

    def _policy_delete(self, region: str, name: str, q: Mapping[str, str]) -> dict[str, Any]:
        doc = self._policy_doc(region, name)
        again = self._repeated(q)
        if again is not None:
            return again
        users = self.members.get((region, name), set())
        if users:
            raise ApiError(400, "resourceInUseByAnotherResource", f"The resource_policy resource "
                           f"'{doc['selfLink']}' is already being used by "
                           f"'instance {sorted(users)[0]}'")  # fmt: skip
        del self.policies[(region, name)]
        self.members.pop((region, name), None)
        return self._as_started(self._operation_done("delete", doc["selfLink"], doc["id"],
                                                     region=region, q=q))  # fmt: skip

    def _policy_list(self, region: str, q: Mapping[str, str]) -> dict[str, Any]:
        self._region(region)
        rows = [self._policy(r, n) for (r, n) in sorted(self.policies) if r == region]
        page, token = self._page([d for d in rows if matches(q.get("filter", ""), d)], q)
        out: dict[str, Any] = {"kind": "compute#resourcePolicyList",
                               "id": f"projects/{self.project}/regions/{region}/resourcePolicies",
                               "items": page, "selfLink": f"{_region_url(self.project, region)}"
                                                          "/resourcePolicies"}  # fmt: skip
        if token:
            out["nextPageToken"] = token
        return out

    # -- operations -----------------------------------------------------------------------
    def _repeated(self, q: Mapping[str, str]) -> dict[str, Any] | None:
        """The operation a mutation with this ``requestId`` made already, if any."""
        rid = q.get("requestId", "")
        if rid and rid in self._by_request:
            return self._as_started(self.operations[self._by_request[rid]])
        return None

    def _operation_done(
        self, kind: str, target: str, target_id: str, *, zone: str | None = None,
        region: str | None = None, q: Mapping[str, str] | None = None,
        errors: list[dict[str, str]] | None = None, group: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """An operation that is DONE: the emulator acts at once (its instances then
        show STAGING for the boot delay); ``errors``: what failed in it."""
        name = f"operation-{int(time.time() * 1000)}-{next(self._ids):x}"
        now = _now_rfc3339()
        if zone:
            base = _zone_url(self.project, zone)
        elif region:
            base = _region_url(self.project, region)
        else:
            base = f"{SELF}/projects/{self.project}/global"
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name,
            "operationType": kind, "targetLink": target, "status": "DONE",
            "user": "burst@burst-lab.iam.gserviceaccount.com", "progress": 100,
            "insertTime": now, "startTime": now, "endTime": now,
            "selfLink": f"{base}/operations/{name}",
        }  # fmt: skip
        if target_id:
            op["targetId"] = target_id
        if zone:
            op["zone"] = base
        if region:
            op["region"] = base
        if group:
            op["operationGroupId"] = group
        if errors:
            op["error"] = {"errors": errors}
            op["httpErrorStatusCode"] = 412 if errors[0]["code"] in CAPACITY_CODES else 409
            op["httpErrorMessage"] = "PRECONDITION FAILED" if errors[0]["code"] in \
                CAPACITY_CODES else "CONFLICT"  # fmt: skip
        self.operations[name] = op
        rid = (q or {}).get("requestId", "")
        if rid:
            self._by_request[rid] = name
        return op

    @staticmethod
    def _as_started(op: dict[str, Any]) -> dict[str, Any]:
        """A mutation's answer: its operation as just started (RUNNING, no outcome yet),
        as Compute answers it; the outcome is read with ``operations.get`` or ``wait``."""
        shown = {k: v for k, v in op.items()
                 if k not in ("error", "httpErrorStatusCode", "httpErrorMessage", "endTime",
                              "instancesBulkInsertOperationMetadata") and k[0] != "_"}  # fmt: skip
        shown.update(status="RUNNING", progress=0)
        return shown

    def _operation(self, name: str) -> dict[str, Any]:
        op = self.operations.get(name)
        if op is None:
            raise ApiError(404, "notFound", f"The resource 'operations/{name}' was not found")
        return self._op_now(op)

    def _op_now(self, op: dict[str, Any]) -> dict[str, Any]:
        """An operation as read now: RUNNING until its work is done (a policy still being
        made: ``policy_delay``), then DONE."""
        if time.time() < op.get("_done_at", 0.0):
            return self._as_started(op)
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def _wait_for(self, name: str) -> None:
        """What ``operations.wait`` does before it answers: wait (two minutes at most)
        until the operation is done; outside the emulator's lock."""
        op = self.operations.get(name)
        left = (op or {}).get("_done_at", 0.0) - time.time()
        if left > 0:
            time.sleep(min(left, 120.0))

    def _operations(self, where: str, q: Mapping[str, str]) -> dict[str, Any]:
        rows = [self._op_now(op) for op in self.operations.values()
                if _last(op.get("zone") or op.get("region") or "") == where]  # fmt: skip
        rows = [op for op in rows if matches(q.get("filter", ""), op)]
        page, token = self._page(rows, q)
        scope = "zones" if where in ZONES else "regions"
        out: dict[str, Any] = {"kind": "compute#operationList", "id": f"projects/{self.project}"
                               f"/{scope}/{where}/operations", "items": page,
                               "selfLink": f"{SELF}/projects/{self.project}/{scope}/{where}"
                                           "/operations"}  # fmt: skip
        if token:
            out["nextPageToken"] = token
        return out


def _is_spot(props: Mapping[str, Any]) -> bool:
    """Whether an instance's properties ask for Spot (or the legacy preemptible) VMs."""
    sched = props.get("scheduling") or {}
    return sched.get("provisioningModel") == "SPOT" or bool(sched.get("preemptible"))


# -- filters: Compute's list filter, the part the daemon sends ------------------------------
_TOKEN = re.compile(r'\s*(?:(\()|(\))|(AND\b)|(OR\b)|(!=|=|:)|"((?:[^"\\]|\\.)*)"|([^\s()"=!:]+))')


def matches(expr: str, resource: Mapping[str, Any]) -> bool:
    """Whether ``resource`` passes a list ``filter``: comparisons ``field = "value"``,
    ``field != value`` and ``field:value`` (has), on dotted fields (``labels.k``), joined
    by ``AND`` (or juxtaposed, in parentheses) and ``OR``; '' passes everything."""
    if not expr.strip():
        return True
    tokens = _tokens(expr)
    pos = 0

    def value_of(path: str) -> Any:
        cur: Any = resource
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, Mapping) else None
        return cur

    def comparison() -> bool:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"filter {expr!r}: ends where a comparison is due")
        kind, text = tokens[pos]
        if kind == "(":
            pos += 1
            got = disjunction()
            if pos >= len(tokens) or tokens[pos][0] != ")":
                raise ValueError(f"filter {expr!r}: an unclosed parenthesis")
            pos += 1
            return got
        if kind != "word" or pos + 2 >= len(tokens):
            raise ValueError(f"filter {expr!r}: expected a comparison at {text!r}")
        field_, (op_kind, op), (_, want) = tokens[pos], tokens[pos + 1], tokens[pos + 2]
        if op_kind != "op":
            raise ValueError(f"filter {expr!r}: expected =, != or : after {field_[1]!r}")
        pos += 3
        have = value_of(field_[1])
        if op == ":":
            return have is not None and (want == "*" or want in str(have))
        if isinstance(have, bool):
            have = str(have).lower()
        same = have is not None and str(have) == want
        return same if op == "=" else not same

    def conjunction() -> bool:
        nonlocal pos
        got = comparison()
        while pos < len(tokens) and tokens[pos][0] not in (")", "OR"):
            if tokens[pos][0] == "AND":
                pos += 1
            got = comparison() and got
        return got

    def disjunction() -> bool:
        nonlocal pos
        got = conjunction()
        while pos < len(tokens) and tokens[pos][0] == "OR":
            pos += 1
            got = conjunction() or got
        return got

    result = disjunction()
    if pos != len(tokens):
        raise ValueError(f"filter {expr!r}: unexpected {tokens[pos][1]!r}")
    return result


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"filter {expr!r}: cannot read it at {expr[pos : pos + 20]!r}")
        pos = m.end()
        lparen, rparen, and_, or_, op, quoted, word = m.groups()
        if lparen:
            out.append(("(", "("))
        elif rparen:
            out.append((")", ")"))
        elif and_:
            out.append(("AND", "AND"))
        elif or_:
            out.append(("OR", "OR"))
        elif op:
            out.append(("op", op))
        elif quoted is not None:
            out.append(("word", quoted.replace('\\"', '"')))
        else:
            out.append(("word", word))
    return out


def scale_key(instance_id: str) -> str:
    """A host key of the instance's own (scale mode): an ed25519 key blob whose 32 bytes
    are a hash of its id, in the form the daemon's parser reads."""
    import hashlib

    blob = (
        b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20"
        + hashlib.sha256(instance_id.encode()).digest()
    )
    return base64.b64encode(blob).decode()


# Compute's default per-project quota groups (docs/scale.md), calls a minute
DEFAULT_QUOTAS = {"default": 1500, "read_requests": 1500, "list_requests": 1500,
                  "operation_read_requests": 1500}  # fmt: skip


def scaled_quotas(factor: float) -> Quotas:
    """Compute's default quotas times ``factor`` (at least one call a window each)."""
    return Quotas({g: max(1, round(n * factor)) for g, n in DEFAULT_QUOTAS.items()})


def boot_vms(emu: GceEmulator, vms: LabVms, vm_range: str) -> None:
    """Booting on: the instances' addresses are ``vm_range`` (a subnet of its own on the
    lab's cloud bridge, its first address the bridge's), their VMs ``vms``."""
    emu.vm_range = ipaddress.IPv4Network(vm_range)
    vms.ensure_network()
    emu.vms = vms


# the service account the emulator serves tokens to (the lab's, the tests')
ACCOUNT = f"slurm-burst@{PROJECT}.iam.gserviceaccount.com"


def write_key_file(path: Path, project: str = PROJECT, account: str = ACCOUNT) -> Path:
    """A service account key file at ``path`` (made here, 0600, never over a file or a
    link already there): an RSA key libcloud signs its token request with; the emulator
    checks that request's shape, not its signature."""
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    doc = {"type": "service_account", "project_id": project, "client_email": account,
           "private_key": key.decode()}  # fmt: skip
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return path


class RemoteGceEmulator(Remote):
    """The emulator serving in another process (``python -m slurm_burst_lab.gceemu``), as
    Compute is another service (the benchmark: its work is not the daemon's CPU), in
    scale mode: Compute's default quotas times ``quotas``, instances STAGING for
    ``boot`` s, their host keys published ``keys_after`` s after that."""

    def __init__(self, quotas: float, boot: float, keys_after: float) -> None:
        args = ["--quotas", str(quotas), "--boot-delay", str(boot), "--keys-after",
                str(keys_after)]  # fmt: skip
        super().__init__("slurm_burst_lab.gceemu", args, "GCE emulator")

    def timeline(self) -> list[tuple[float, str, bool]]:
        return [(float(t), str(m), bool(x)) for t, m, x in self.get("timeline")["timeline"]]


def main(argv: list[str] | None = None) -> None:
    """``python -m slurm_burst_lab.gceemu PORT``: Compute's API for the lab's project on
    127.0.0.1:PORT; ``--quotas F``: scale mode, Compute's default rate quotas times F
    (403 rateLimitExceeded past them); ``--boot-delay S``: instances STAGING for S s;
    ``--boot STATE_DIR``: instances boot as namespace VMs (the lab); SIGTERM halts them."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m slurm_burst_lab.gceemu")
    ap.add_argument("port", type=int)
    ap.add_argument("--quotas", type=float, default=None, metavar="F",
                    help="scale mode: Compute's default quotas times F")  # fmt: skip
    ap.add_argument("--boot-delay", type=float, default=0.0)
    ap.add_argument("--keys-after", type=float, default=None, metavar="S",
                    help="scale mode: each instance's host key, S s after it runs")  # fmt: skip
    ap.add_argument(
        "--boot",
        metavar="STATE_DIR",
        default="",
        help="instances boot as namespace VMs (the lab), kept under STATE_DIR",
    )
    ap.add_argument("--bridge", default="sbl-inet")
    ap.add_argument(
        "--range",
        dest="vm_range",
        default="10.251.1.0/24",
        help="with --boot: the instances' subnet on the bridge",
    )
    ap.add_argument("--vm-delay", type=float, default=2.0, help="with --boot: VM boot seconds")
    ap.add_argument("--hide", action="append", default=[])
    args = ap.parse_args(argv)
    if args.quotas is not None and not 0 < args.quotas < 1e6:
        ap.error(f"--quotas {args.quotas}: a factor above 0")
    if not 0 <= args.boot_delay < 86400:
        ap.error(f"--boot-delay {args.boot_delay}: seconds, from 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    quotas = scaled_quotas(args.quotas) if args.quotas is not None else None
    if args.keys_after is not None and not 0 <= args.keys_after < 86400:
        ap.error(f"--keys-after {args.keys_after}: seconds, from 0")
    emu = GceEmulator(quotas=quotas, boot_delay=args.boot_delay, keys_after=args.keys_after)
    vms: LabVms | None = None
    if args.boot:
        net = ipaddress.IPv4Network(args.vm_range)
        vms = LabVms(args.boot, args.bridge, str(net), args.vm_delay, tuple(args.hide))
        boot_vms(emu, vms, str(net))
    emu.port = args.port
    serve_until_sigterm(emu, args.port, vms)


if __name__ == "__main__":
    main()
