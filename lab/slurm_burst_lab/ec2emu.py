"""An EC2 API emulator on loopback: moto's EC2 server behind a WSGI wrapper (tests, the lab).

libcloud's own EC2 driver talks to it over HTTP with SigV4, exactly as it talks to
AWS. The wrapper makes moto answer the way EC2 does where it differs, and nothing
more (see ../shared/docs/LAB-NOTES.md):

- the XML namespace: moto answers ``.../doc/2016-11-15``, EC2 ``.../doc/2016-11-15/``
  (libcloud parses with the latter);
- ``ClientToken`` idempotency of RunInstances, which moto does not implement: the
  same token with the same parameters returns the first answer (the same
  reservation), with other parameters ``IdempotentParameterMismatch``, as EC2 does;
- CreateFleet's answer (type ``instant``): one ``fleetInstanceSet`` entry per pool with
  all its instance ids, and an ``errorSet`` always (moto sends an entry per instance
  and no empty ``errorSet``);
- error injection: :meth:`Ec2Emulator.inject` makes the next calls of an action
  fail with a real EC2 error document (code, message, HTTP status);
- EC2's MinCount/MaxCount rule (moto makes MinCount): as many instances as there is
  room for, up to MaxCount, or InsufficientInstanceCapacity if that is fewer than
  MinCount. Room is unlimited unless :meth:`Ec2Emulator.limit` gives an instance type
  room for N instances per call.

- GetConsoleOutput as EC2 serves it: an instance's console is :attr:`Ec2Emulator.console`
  (set by a test, or a booted VM's console);
  ``Latest=true`` is served on Nitro instance types only (moto's DescribeInstanceTypes
  data says which) and refused elsewhere with ``UnsupportedOperation``; the buffered
  output (no ``Latest``) appears ``buffer_lag`` seconds after the instance was made,
  as EC2 posts it "shortly after" a state change.

- placement groups and spot capacity a test can refuse or withhold
  (:mod:`slurm_burst_lab.ec2market`, :attr:`Ec2Emulator.market`);

- Booting (opt-in, :class:`~slurm_burst_lab.labvms.LabVms`): each instance becomes a
  namespace VM at its private IP. Instances launched without a subnet go to the
  emulator's default subnet (``default_subnet``), a range of the lab bridge's subnet.

- Scale mode (opt-in, :class:`Scale`; the 1,000-node benchmark): EC2's request
  throttling, one token bucket per API as EC2 documents them (``throttle`` scales
  them down for small lab runs) answering ``RequestLimitExceeded`` (HTTP 503), and
  RunInstances' instance bucket; instances that stay ``pending`` for ``boot`` seconds
  and print a host-key block on their console ``console`` seconds after that; and
  DescribeInstances answered from moto's records directly, paginated (moto's own
  answer costs ~6 ms an instance, 6 s for a page of 1,000, where EC2's takes a second
  or two); RunInstances answered in EC2's form by the wrapper, not moto's generic
  serializer (moto made the instances in ~0.5 s and took ~4 s more to write the
  answer of 500; CreateFleet, whose answer holds only ids, was not slowed so). A
  timeline of every call (when, action, throttled) is kept.

Every request is counted by action (:attr:`Ec2Emulator.calls`) for the tests'
assertions and the launch benchmark; console reads are kept whole
(:attr:`Ec2Emulator.console_reads`).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from slurm_burst_lab.ec2imds import Imds
from slurm_burst_lab.ec2market import Market
from slurm_burst_lab.labvms import LabVms
from slurm_burst_lab.loopback import Remote, serve, serve_until_sigterm, shut

log = logging.getLogger(__name__)

NS_MOTO = b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15"'
NS_EC2 = b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
# parameters that differ between two sends of the same request
_VOLATILE = {"Signature", "SignatureMethod", "SignatureVersion", "Timestamp", "AWSAccessKeyId"}

StartResponse = Callable[..., Any]
ACCOUNT = "123456789012"  # moto's default account

# EC2's request buckets per API (burst, refill a second), from EC2's API reference
# ("Request throttling"), November 2026; the emulator's own copy, so that a wrong
# number in the daemon's table shows as throttling here.
EC2_BUCKETS: dict[str, tuple[float, float]] = {
    "RunInstances": (5, 2), "CreateTags": (100, 10), "TerminateInstances": (100, 5),
    "CreateFleet": (50, 5),
}  # fmt: skip
NON_MUTATING = (100, 20)  # Describe*, Get*, List*
MUTATING = (50, 5)
RESOURCE_BUCKETS = {"RunInstances": (1000, 2), "TerminateInstances": (1000, 20)}


@dataclass
class Scale:
    """The emulator's scale mode (see the module's docstring)."""

    throttle: float = 1.0  # EC2's buckets times this; 0: no throttling
    boot: float = 60.0  # seconds an instance stays pending
    console: float = 30.0  # seconds after boot its host keys are on its console


class _Bucket:
    def __init__(self, burst: float, refill: float) -> None:
        self.burst, self.refill = max(1.0, burst), refill
        self.tokens, self.stamp = self.burst, time.monotonic()

    def take(self, amount: float = 1.0) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.refill)
        self.stamp = now
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True


def bucket_of(action: str) -> tuple[float, float]:
    if action in EC2_BUCKETS:
        return EC2_BUCKETS[action]
    return NON_MUTATING if action.startswith(("Describe", "Get", "List")) else MUTATING


@dataclass
class Fault:
    action: str
    code: str
    message: str
    http: int
    times: int


def error_document(code: str, message: str) -> bytes:
    """The body of an EC2 error response."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        "</Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    ).encode()


def _as_ec2_error(body: bytes) -> bytes:
    """moto's error answer as EC2 sends it: EC2's error documents carry no XML namespace
    (moto puts its success namespace on them, and libcloud then finds no error code)."""
    code = re.search(rb"<Code>(.*?)</Code>", body, re.S)
    message = re.search(rb"<Message>(.*?)</Message>", body, re.S)
    if code is None:
        return body
    return error_document(code.group(1).decode(), message.group(1).decode() if message else "")


class Ec2Emulator:
    """moto's EC2 backend as a WSGI app, made to answer like EC2; serve with :meth:`start`.

    moto's backend is not thread-safe (a DescribeInstances iterating the tags while a
    CreateTags adds one fails with "dictionary changed size"), so by default calls are
    served one at a time: tests want right answers. The benchmark's emulator
    (``serialize=False``) lets calls overlap, as EC2 does: one slow DescribeInstances of
    1,000 instances must not hold up every launch behind it.
    """

    def __init__(self, serialize: bool = True, scale: Scale | None = None) -> None:
        from moto.server import create_backend_app  # type: ignore[attr-defined]

        self._app = create_backend_app("ec2")
        self.scale = scale
        self._buckets: dict[str, _Bucket] = {}
        self._made_buckets: dict[str, _Bucket] = {}
        self.timeline: list[tuple[float, str, bool]] = []  # (monotonic, action, throttled)
        self.throttled = 0
        _fast_image_lookup()
        _fast_run_answer()
        self._fast_answers = scale is not None  # only the scale mode's emulator
        self.calls: Counter[str] = Counter()
        self._faults: list[Fault] = []
        self._room: dict[str, int] = {}  # instance type -> most instances one call makes
        self._tokens: dict[str, tuple[tuple[tuple[str, str], ...], str, list[Any], bytes]] = {}
        self._lock = threading.Lock()
        self._moto: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if serialize else contextlib.nullcontext()
        )
        self._server: Any = None
        self.port = 0
        # consoles: instance id -> text, or a function that reads it (a booted VM's)
        self.console: dict[str, str] = {}
        self.buffer_lag = 0.0
        self.console_reads: list[dict[str, str]] = []
        self.made: dict[str, tuple[str, float]] = {}  # instance id -> (type, when made)
        self.vms: LabVms | None = None  # instances boot as VMs (the lab)
        self.key_pairs: dict[str, str] = {}  # key pair name -> public key line (booting)
        self.default_subnet = ""  # SubnetId for a RunInstances that names none
        self.market = Market(error_document, NS_EC2.decode())
        self.imds = Imds()  # each booted instance's metadata, in its own namespace

    # -- control --------------------------------------------------------------
    def start(self) -> int:
        self._server = serve(self, "ec2-emulator")
        self.port = int(self._server.server_port)
        return self.port

    def stop(self) -> None:
        shut(self._server)
        self._server = None

    def inject(
        self, action: str, code: str, http: int = 400, times: int = 1, message: str = ""
    ) -> None:
        """The next ``times`` calls of ``action`` fail with EC2's error ``code``."""
        with self._lock:
            self._faults.append(Fault(action, code, message or f"injected {code}", http, times))

    def throttle(self, factor: float) -> None:
        """EC2's request throttling from now on, its buckets times ``factor`` (full
        buckets); 0 turns it off. The rest of scale mode stays as it was (a lab whose
        instances boot as VMs keeps their own timing)."""
        if not (0 <= factor < 1e6):
            raise ValueError(f"throttle factor {factor!r}: a number from 0")
        with self._lock:
            if self.scale is None:
                self.scale = Scale(throttle=factor, boot=0.0, console=0.0)
            else:
                self.scale.throttle = factor
            self._buckets.clear()
            self._made_buckets.clear()

    def limit(self, instance_type: str, room: int) -> None:
        """Calls of RunInstances for ``instance_type`` make at most ``room`` instances."""
        with self._lock:
            self._room[instance_type] = room

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._room.clear()
            self.market.clear()
            self.calls.clear()
            self.timeline.clear()
            self.throttled = 0

    def driver(self, region: str = "us-east-1") -> Any:
        return driver_for(self.port, region)

    # -- WSGI -----------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").startswith("/_emulator/"):
            return self._control(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        params = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if body and "form" in environ.get("CONTENT_TYPE", ""):
            params += parse_qsl(body.decode(), keep_blank_values=True)
        args = dict(params)
        action = args.get("Action", "")
        with self._lock:
            self.calls[action] += 1
            fault = next((f for f in self._faults if f.action == action), None)
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
            limited = self._limited(action, args)
            if self.scale is not None:
                self.timeline.append((time.monotonic(), action, limited))
        if limited:
            return self._answer(start_response, "503 Service Unavailable", [], error_document(
                "RequestLimitExceeded", "Request limit exceeded."))  # fmt: skip
        if fault is not None:
            return self._answer(start_response, f"{fault.http} ERROR", [], error_document(
                fault.code, fault.message))  # fmt: skip
        if action == "GetConsoleOutput":
            return self._console(start_response, args)
        placed = self.market.answer(action, args, self._alive)
        if placed is not None:
            return self._answer(start_response, placed[0], [], placed[1])
        if action == "DescribeInstances" and self.scale is not None:
            listed = self._describe(params)
            if listed is not None:
                return self._answer(start_response, "200 OK", [], listed)
        if (
            action == "RunInstances"
            and self.default_subnet
            and not any(k == "SubnetId" or k.startswith("NetworkInterface.") for k, _ in params)
        ):
            params = _rewrite(environ, lambda pairs: [*pairs, ("SubnetId", self.default_subnet)])
            args = dict(params)
        fingerprint = tuple(sorted((k, v) for k, v in params if k not in _VOLATILE))
        if action == "RunInstances":
            with self._lock:
                room = self._room.get(args.get("InstanceType", ""))
            refused = self.market.refuse_run(args, self._alive) or self._within(
                environ, params, room
            )
            if refused is not None:
                return self._answer(start_response, "500 Internal Server Error", [], refused)
        token = args.get("ClientToken") if action == "RunInstances" else None
        if token:
            with self._lock:
                seen = self._tokens.get(token)
            if seen is not None:
                if seen[0] != fingerprint:
                    return self._answer(start_response, "400 Bad Request", [], error_document(
                        "IdempotentParameterMismatch",
                        "The client token has been used with different parameters"))  # fmt: skip
                return self._answer(start_response, seen[1], seen[2], seen[3])
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return lambda _data: None

        with self._moto:
            _FAST.on = self._fast_answers and action == "RunInstances"
            try:
                out = b"".join(self._app(environ, capture)).replace(NS_MOTO, NS_EC2)
            finally:
                _FAST.on = False
        if not captured["status"].startswith("2"):
            out = _as_ec2_error(out)
        elif action == "CreateFleet":
            out = _fleet_as_ec2(out)
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        if token and captured["status"].startswith("200"):
            with self._lock:
                self._tokens[token] = (fingerprint, captured["status"], headers, out)
        if captured["status"].startswith("200"):
            self._after(action, args, params, out)
        return self._answer(start_response, captured["status"], headers, out)

    # -- consoles and VMs -------------------------------------------------------------
    def _after(
        self, action: str, args: dict[str, str], params: list[tuple[str, str]], out: bytes
    ) -> None:
        """What a successful call means beyond moto's records: instances noted (and
        booted), a key pair's public key kept for booting, terminated VMs halted."""
        if action == "RunInstances":
            self._made(args, out)
        elif self.vms is not None and action == "ImportKeyPair":
            line = _decoded(args.get("PublicKeyMaterial", ""))
            if line:
                with self._lock:
                    self.key_pairs[args.get("KeyName", "")] = line.strip()
        elif self.vms is not None and action == "TerminateInstances":
            for key, value in params:
                if key.startswith("InstanceId."):
                    self.imds.stop(value)
                    self.vms.halt(value)

    def _made(self, args: dict[str, str], answer: bytes) -> None:
        """Note each new instance's type and birth; boot its VM if booting is on."""
        from xml.etree import ElementTree

        ns = {"e": NS_EC2.decode().split('"')[1]}
        now = time.monotonic()
        root = ElementTree.fromstring(answer)  # noqa: S314 - moto's own answer, not input
        items = list(root.iterfind("e:instancesSet/e:item", ns))
        withheld = self.market.made(args, [i.findtext("e:instanceId", "", ns) for i in items])
        for iid in withheld:  # capacity that never comes: pending, no VM
            inst = self._moto_instance(iid)
            if inst is not None:
                inst._state.name, inst._state.code = "pending", 0
        for item in items:
            iid = item.findtext("e:instanceId", "", ns)
            with self._lock:
                self.made.setdefault(iid, (item.findtext("e:instanceType", "", ns), now))
            if self.vms is not None and iid not in withheld:
                ip = item.findtext("e:privateIpAddress", "", ns)
                with self._lock:
                    key = self.key_pairs.get(args.get("KeyName", ""), "")
                self.vms.boot(
                    iid, ip, _decoded(args.get("UserData", "")) or None, (key,) if key else (),
                    args.get("ImageId", ""),
                )  # fmt: skip
                self.imds.serve(iid, self.vms.netns_of(iid))

    def interrupt(self, instance_id: str, seconds: float) -> dict[str, str]:
        """A spot interruption notice on ``instance_id`` (its metadata says so at once),
        and the reclaim ``seconds`` later: terminated, its VM halted, as EC2 does."""
        if not (0 < seconds <= 3600) or self._moto_instance(instance_id) is None:
            raise ValueError(f"interrupt {instance_id!r} in {seconds!r} s: no such instance, "
                             "or not 0 < seconds <= 3600")  # fmt: skip
        notice = self.imds.interrupt(instance_id, seconds)
        timer = threading.Timer(seconds, self._reclaim, args=(instance_id,))
        timer.daemon = True
        timer.start()
        return notice

    def _reclaim(self, instance_id: str) -> None:
        inst = self._moto_instance(instance_id)
        with self._moto:
            if inst is not None and inst._state.name != "terminated":
                inst.terminate()
        self.imds.stop(instance_id)
        if self.vms is not None:
            self.vms.halt(instance_id)
        log.info("ec2emu.reclaimed instance=%s", instance_id)

    @staticmethod
    def _moto_instance(instance_id: str, region: str = "us-east-1") -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT][region].get_instance_by_id(instance_id)

    def _alive(self, instance_id: str) -> bool:
        """Whether moto holds the instance and it is not terminated."""
        inst = self._moto_instance(instance_id)
        return inst is not None and inst._state.name != "terminated"

    def _console(self, start_response: StartResponse, args: dict[str, str]) -> list[bytes]:
        from moto.ec2.models.instance_types import INSTANCE_TYPES

        iid = args.get("InstanceId", "")
        with self._lock:
            self.console_reads.append(dict(args))
            itype, born = self.made.get(iid, ("", 0.0))
        if not itype:
            return self._refuse(
                start_response,
                "InvalidInstanceID.NotFound",
                f"The instance ID '{iid}' does not exist",
            )
        latest = args.get("Latest", "").lower() == "true"
        if latest and INSTANCE_TYPES.get(itype, {}).get("Hypervisor") != "nitro":
            return self._refuse(
                start_response,
                "UnsupportedOperation",
                f"The latest console output is not supported for instance type {itype}",
            )
        text = self.console.get(iid)
        if text is None and self.vms is not None:
            text = self.vms.console(iid)
        if text is None and self.scale is not None:
            up = time.monotonic() - born >= self.scale.boot + self.scale.console
            text = scale_console(iid) if up else "booting...\n"
        if not latest and time.monotonic() - born < self.buffer_lag:
            text = ""  # not posted yet
        output = base64.b64encode((text or "").encode()).decode()
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<GetConsoleOutputResponse {NS_EC2.decode()}>'
            "<requestId>00000000-0000-0000-0000-000000000001</requestId>"
            f"<instanceId>{iid}</instanceId>"
            f"<timestamp>{time.strftime('%Y-%m-%dT%H:%M:%S.000Z', time.gmtime())}</timestamp>"
            f"<output>{output}</output></GetConsoleOutputResponse>"
        ).encode()
        return self._answer(start_response, "200 OK", [], body)

    # -- scale mode --------------------------------------------------------------------
    def _limited(self, action: str, args: dict[str, str]) -> bool:
        """Whether EC2 would throttle this call now (scale mode; the lock is held)."""
        if self.scale is None or self.scale.throttle <= 0 or not action:
            return False
        f = self.scale.throttle
        b = self._buckets.get(action)
        if b is None:
            burst, refill = bucket_of(action)
            b = self._buckets[action] = _Bucket(burst * f, refill * f)
        limited = not b.take()
        if not limited and action in RESOURCE_BUCKETS:
            made = self._made_buckets.get(action)
            if made is None:
                burst, refill = RESOURCE_BUCKETS[action]
                made = self._made_buckets[action] = _Bucket(burst * f, refill * f)
            count = int(args.get("MaxCount", 0) or 0) or sum(
                1 for k in args if k.startswith("InstanceId.")
            )
            limited = not made.take(max(1, count))
        if limited:
            self.throttled += 1
        return limited

    def _describe(self, params: list[tuple[str, str]]) -> bytes | None:
        """DescribeInstances from moto's records (scale mode): filters on tags, state and
        ids, ``MaxResults``/``NextToken`` pages; None (moto answers) for any other
        filter."""
        from moto.ec2.models import ec2_backends

        args = dict(params)
        filters: dict[str, set[str]] = {}
        for k, v in params:
            if k.startswith("Filter.") and k.endswith(".Name"):
                n = k.split(".")[1]
                filters[v] = {w for kk, w in params if kk.startswith(f"Filter.{n}.Value.")}
        if any(not (f.startswith("tag:") or f in ("instance-state-name", "instance-id"))
               for f in filters):  # fmt: skip
            return None
        ids = {v for k, v in params if k.startswith("InstanceId.")}
        backend = ec2_backends[ACCOUNT][args.get("Region") or "us-east-1"]
        assert self.scale is not None
        now = time.monotonic()
        with self._lock:
            made = dict(self.made)
        rows = []
        for res in list(backend.reservations.values()):
            for inst in list(res.instances):
                tags = dict(backend.tags.get(inst.id, {}))
                state = inst._state.name
                born = made.get(inst.id, ("", now))[1]  # RunInstances not answered: just made
                if state == "running" and now - born < self.scale.boot:
                    state = "pending"
                if ids and inst.id not in ids:
                    continue
                if "instance-id" in filters and inst.id not in filters["instance-id"]:
                    continue
                if "instance-state-name" in filters and state not in filters["instance-state-name"]:
                    continue
                if any(tags.get(f[4:]) not in vals for f, vals in filters.items()
                       if f.startswith("tag:")):  # fmt: skip
                    continue
                rows.append((res.id, inst, state, tags))
        start = int(args.get("NextToken") or 0)
        size = int(args.get("MaxResults") or 0) or len(rows) or 1
        page = rows[start : start + size]
        nxt = f"<nextToken>{start + size}</nextToken>" if start + size < len(rows) else ""
        body = "".join(_instance_xml(r, i, st, t) for r, i, st, t in page)
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<DescribeInstancesResponse {NS_EC2.decode()}>'
            "<requestId>00000000-0000-0000-0000-000000000002</requestId>"
            f"<reservationSet>{body}</reservationSet>{nxt}</DescribeInstancesResponse>"
        ).encode()

    def _refuse(self, start_response: StartResponse, code: str, message: str) -> list[bytes]:
        return self._answer(start_response, "400 Bad Request", [], error_document(code, message))

    @staticmethod
    def _within(
        environ: dict[str, Any], params: list[tuple[str, str]], room: int | None
    ) -> bytes | None:
        """Make a RunInstances make what EC2 would: MinCount and MaxCount both set to what
        there is room for (up to MaxCount), or EC2's capacity error (returned) if that
        is fewer than MinCount. The request is rewritten for moto where it came from
        (the query string or the form)."""
        args = dict(params)
        low, high = int(args.get("MinCount", 1)), int(args.get("MaxCount", 1))
        made = high if room is None else min(room, high)
        if made < low:
            return error_document(
                "InsufficientInstanceCapacity",
                f"We currently do not have sufficient {args.get('InstanceType')} capacity "
                f"({room} left, MinCount {low})",
            )
        if made != low:
            _rewrite(environ, lambda pairs: [
                (k, str(made) if k in ("MinCount", "MaxCount") else v) for k, v in pairs
            ])  # fmt: skip
        return None

    def _control(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """For a test in another process: GET /_emulator/calls, POST /_emulator/clear,
        POST /_emulator/inject?action=&code=&http=&times=, POST
        /_emulator/throttle?factor=F, GET /_emulator/timeline, POST
        /_emulator/spot?mode=refuse|withhold| (spot capacity), GET /_emulator/market
        (placement groups and their members, the spot mode, withheld instances), POST
        /_emulator/interrupt?instance=I&in=S (a spot interruption notice, the reclaim S
        seconds later)."""
        path = environ["PATH_INFO"].removeprefix("/_emulator/")
        args = dict(parse_qsl(environ.get("QUERY_STRING", "")))
        if path == "timeline":
            with self._lock:
                data = {"timeline": list(self.timeline), "throttled": self.throttled}
            body = json.dumps(data).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])  # fmt: skip
            return [body]
        if path == "throttle":
            try:
                self.throttle(float(args.get("factor", "0")))
            except ValueError as exc:
                said = str(exc).encode()
                start_response("400 Bad Request", [("Content-Type", "text/plain"),
                                                   ("Content-Length", str(len(said)))])  # fmt: skip
                return [said]
        if path == "spot":
            try:
                self.market.set_spot(args.get("mode", ""))
            except ValueError as exc:
                said = str(exc).encode()
                start_response("400 Bad Request", [("Content-Type", "text/plain"),
                                                   ("Content-Length", str(len(said)))])  # fmt: skip
                return [said]
        if path == "interrupt":
            iid = args.get("instance", "")
            try:
                notice = self.interrupt(iid, float(args.get("in", "120")))
            except ValueError as exc:
                said = str(exc).encode()
                start_response("400 Bad Request", [("Content-Type", "text/plain"),
                                                   ("Content-Length", str(len(said)))])  # fmt: skip
                return [said]
            body = json.dumps(notice).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])  # fmt: skip
            return [body]
        if path == "market":
            body = json.dumps(self.market.snapshot()).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])  # fmt: skip
            return [body]
        if path == "clear":
            self.clear()
        elif path == "inject":
            self.inject(args["action"], args["code"], int(args.get("http", 400)),
                        int(args.get("times", 1)))  # fmt: skip
        body = json.dumps(dict(self.calls)).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])  # fmt: skip
        return [body]

    @staticmethod
    def _answer(
        start_response: StartResponse, status: str, headers: list[Any], body: bytes
    ) -> list[bytes]:
        headers = [h for h in headers if h[0].lower() != "content-type"]
        start_response(
            status,
            [*headers, ("Content-Type", "text/xml"), ("Content-Length", str(len(body)))],
        )
        return [body]


def _fleet_as_ec2(answer: bytes) -> bytes:
    """CreateFleet's answer as EC2 shapes it: the instances of one pool (launch template
    and overrides, lifecycle) in one entry, and an ``errorSet`` even when empty."""
    from xml.etree import ElementTree

    uri = NS_EC2.decode().split('"')[1]
    ns = {"e": uri}
    ElementTree.register_namespace("", uri)
    root = ElementTree.fromstring(answer)  # noqa: S314 - moto's own answer, not input
    fleet = root.find("e:fleetInstanceSet", ns)
    if fleet is not None:
        pools: dict[bytes, Any] = {}
        for item in list(fleet):
            ids = item.find("e:instanceIds", ns)
            key = b"".join(ElementTree.tostring(child) for child in item if child is not ids)
            first = pools.get(key)
            if first is None:
                pools[key] = item
                continue
            held = first.find("e:instanceIds", ns)
            if held is not None and ids is not None:
                held.extend(list(ids))
            fleet.remove(item)
    if root.find("e:errorSet", ns) is None:
        ElementTree.SubElement(root, f"{{{uri}}}errorSet")
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root)


def _rewrite(
    environ: dict[str, Any],
    change: Callable[[list[tuple[str, str]]], list[tuple[str, str]]],
) -> list[tuple[str, str]]:
    """Rewrite a request's parameters for moto where they came from: the form body if
    it has one, else the query string; return them all."""
    body = environ["wsgi.input"].getvalue().decode()
    form = "form" in environ.get("CONTENT_TYPE", "") and bool(body)
    query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    posted = parse_qsl(body, keep_blank_values=True) if form else []
    if form:
        body = urlencode(change(posted))
    else:
        environ["QUERY_STRING"] = urlencode(change(query))
    data = body.encode()
    environ["CONTENT_LENGTH"] = str(len(data))
    environ["wsgi.input"] = io.BytesIO(data)
    query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    return query + (parse_qsl(body, keep_blank_values=True) if form else [])


def driver_for(port: int, region: str = "us-east-1") -> Any:
    """libcloud's EC2 driver pointed at an emulator on ``port`` (SigV4, plain HTTP)."""
    from libcloud.compute.drivers.ec2 import EC2NodeDriver

    return EC2NodeDriver(  # type: ignore[no-untyped-call]
        "AKIDEMULATOR000000000",
        "emulator-secret",
        region=region,
        secure=False,
        host="127.0.0.1",
        port=port,
        signature_version="4",
    )


def _instance_xml(reservation: str, inst: Any, state: str, tags: dict[str, str]) -> str:
    """One instance of a DescribeInstances answer: the fields EC2 sends that libcloud
    reads (scale mode)."""
    return (
        f"<item><reservationId>{reservation}</reservationId><ownerId>{ACCOUNT}</ownerId>"
        f"<instancesSet>{_instance_item(inst, state, tags)}</instancesSet></item>"
    )


def _instance_item(inst: Any, state: str, tags: dict[str, str]) -> str:
    from xml.sax.saxutils import escape

    code = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48,
            "stopping": 64, "stopped": 80}.get(state, 0)  # fmt: skip
    tag_xml = "".join(
        f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in tags.items()
    )
    private = inst.private_ip or ""
    zone = escape(str(getattr(inst.placement, "zone", "") or ""))
    public = f"<ipAddress>{inst.public_ip}</ipAddress>" if inst.public_ip else ""
    subnet = escape(str(getattr(inst, "subnet_id", "") or ""))
    return (
        f"<item><instanceId>{inst.id}</instanceId>"
        f"<imageId>{escape(inst.image_id or '')}</imageId>"
        f"<instanceState><code>{code}</code><name>{state}</name></instanceState>"
        f"<privateDnsName>ip-{private.replace('.', '-')}.ec2.internal</privateDnsName>"
        f"<keyName>{escape(inst.key_name or '')}</keyName>"
        f"<amiLaunchIndex>{inst.ami_launch_index}</amiLaunchIndex>"
        f"<instanceType>{escape(inst.instance_type)}</instanceType>"
        f"<launchTime>{str(inst.launch_time)[:19].replace(' ', 'T')}.000Z</launchTime>"
        f"<placement><availabilityZone>{zone}</availabilityZone>"
        f"</placement><subnetId>{subnet}</subnetId>"
        f"<privateIpAddress>{private}</privateIpAddress>{public}"
        f"<tagSet>{tag_xml}</tagSet></item>"
    )


def scale_console(instance_id: str) -> str:
    """A console with the host-key block cloud-init prints (scale mode): a fixed key per
    instance, the form the daemon's parser reads."""
    import hashlib

    blob = (
        b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20"
        + hashlib.sha256(instance_id.encode()).digest()
    )
    key = base64.b64encode(blob).decode()
    from slurm_burst.core.hostkeys import BEGIN, END

    return f"cloud-init: booting\n{BEGIN}\nssh-ed25519 {key} root@{instance_id}\n{END}\n"


_FAST = threading.local()  # this thread's RunInstances is answered by _fast_run_answer


def _fast_run_answer() -> None:
    """RunInstances' answer written here, in EC2's form with the fields libcloud reads,
    where the emulator asks for it (scale mode, :data:`_FAST`): moto's model-driven
    serializer spends ~9 ms an instance on it (4 s for 500), more than making them;
    EC2 answers a launch of 500 in a second or two. moto still makes the instances."""
    from moto.ec2.responses.instances import InstanceResponse

    if getattr(InstanceResponse.run_instances, "_fast", False):
        return
    slow = InstanceResponse.run_instances

    def run_instances(self: Any) -> Any:
        made = slow(self)
        if not getattr(_FAST, "on", False):
            return made
        res: Any = made.result
        items = "".join(
            _instance_item(i, "pending", dict(self.ec2_backend.tags.get(i.id, {})))
            for i in res.instances
        )
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<RunInstancesResponse {NS_EC2.decode()}>'
            "<requestId>00000000-0000-0000-0000-000000000003</requestId>"
            f"<reservationId>{res.id}</reservationId><ownerId>{ACCOUNT}</ownerId>"
            f"<groupSet/><instancesSet>{items}</instancesSet></RunInstancesResponse>"
        )

    run_instances._fast = True  # type: ignore[attr-defined]
    InstanceResponse.run_instances = run_instances  # type: ignore[method-assign]


def _fast_image_lookup() -> None:
    """moto looks up a new instance's image by filtering every one of its ~1,300 AMIs
    with fnmatch, once per instance (7 of the 16 s a RunInstances of 500 took under a
    profiler); EC2 does no such thing. An exact ``image-id`` lookup is answered from
    moto's own dict instead; any other query goes to moto as before."""
    from moto.ec2.models.amis import AmiBackend

    if getattr(AmiBackend.describe_images, "_fast", False):
        return
    slow = AmiBackend.describe_images

    def describe_images(self: Any, ami_ids: Any = None, filters: Any = None,
                        exec_users: Any = None, owners: Any = None) -> Any:  # fmt: skip
        one = isinstance(filters, dict) and len(filters) == 1
        wanted = filters.get("image-id") if one else None
        exact = isinstance(wanted, str) and "*" not in wanted and "?" not in wanted
        if exact and not ami_ids and not exec_users and not owners:
            ami = self.amis.get(wanted)
            return [ami] if ami is not None else []
        return slow(self, ami_ids=ami_ids, filters=filters, exec_users=exec_users, owners=owners)

    describe_images._fast = True  # type: ignore[attr-defined]
    AmiBackend.describe_images = describe_images  # type: ignore[method-assign]


class RemoteEmulator(Remote):
    """An emulator serving in another process (``python -m slurm_burst_lab.ec2emu``), as
    EC2 is another service: its calls counted and faults injected over HTTP."""

    def __init__(self, scale: Scale | None = None) -> None:
        opts = [] if scale is None else [
            "--throttle", str(scale.throttle), "--boot-after", str(scale.boot),
            "--console-after", str(scale.console),
        ]  # fmt: skip
        super().__init__("slurm_burst_lab.ec2emu", opts, "EC2 emulator")

    def driver(self, region: str = "us-east-1") -> Any:
        return driver_for(self.port, region)

    def throttle(self, factor: float) -> None:
        """EC2's throttling on (its buckets times ``factor``) or off (0), from now on."""
        self.get(f"throttle?factor={factor}")

    def timeline(self) -> dict[str, Any]:
        """Scale mode: every call as (monotonic seconds, action, throttled), and how many
        were throttled."""
        return self.get("timeline")


def _decoded(b64: str) -> str:
    """A base64 parameter (user-data, a key pair's public key) as text; '' if it is not."""
    try:
        return base64.b64decode(b64).decode() if b64 else ""
    except (ValueError, UnicodeDecodeError):
        return ""


def boot_vms(emu: Ec2Emulator, vms: LabVms, vm_range: str) -> None:
    """Booting on: a VPC and default subnet (``vm_range``, inside the lab bridge's subnet)
    for instances launched without one; call once the emulator serves."""
    import ipaddress

    vms.ensure_network()
    vpc_cidr = ipaddress.ip_network(vm_range).supernet(new_prefix=16)
    driver = emu.driver()
    vpc = driver.ex_create_network(str(vpc_cidr))  # (its name= tags 0-based: refused)
    subnet = driver.ex_create_subnet(vpc.id, vm_range, "us-east-1a")
    emu.vms, emu.default_subnet = vms, subnet.id


def main(argv: list[str] | None = None) -> None:
    """``python -m slurm_burst_lab.ec2emu PORT``: API only (the launch benchmark, calls
    overlapping as on EC2). With ``--boot STATE_DIR``: instances boot as namespace VMs
    (the lab), calls served one at a time; SIGTERM halts every VM, then exits."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m slurm_burst_lab.ec2emu")
    ap.add_argument("port", type=int)
    ap.add_argument("--boot", metavar="STATE_DIR", default="")
    ap.add_argument("--bridge", default="sbl-inet")
    ap.add_argument("--subnet", default="10.251.0.0/24", help="the bridge's subnet")
    ap.add_argument("--range", dest="vm_range", default="10.251.0.128/25")
    ap.add_argument("--boot-delay", type=float, default=2.0)
    ap.add_argument("--hide", action="append", default=[])
    ap.add_argument(
        "--throttle",
        type=float,
        default=None,
        help="scale mode: EC2's API buckets times this (0: none)",
    )
    ap.add_argument(
        "--boot-after",
        type=float,
        default=60.0,
        help="scale mode: seconds an instance stays pending",
    )
    ap.add_argument(
        "--console-after",
        type=float,
        default=30.0,
        help="scale mode: seconds after boot its console has its host keys",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    scale = None
    if args.throttle is not None:
        scale = Scale(args.throttle, args.boot_after, args.console_after)
    emu = Ec2Emulator(serialize=bool(args.boot), scale=scale)
    emu.port = args.port
    vms: LabVms | None = None
    if args.boot:
        vms = LabVms(args.boot, args.bridge, args.subnet, args.boot_delay, tuple(args.hide))
        threading.Thread(target=lambda: boot_vms(emu, vms, args.vm_range), daemon=True).start()
    serve_until_sigterm(emu, args.port, vms)


if __name__ == "__main__":
    main()
