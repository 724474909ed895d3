"""An Azure Resource Manager emulator on loopback (tests, the lab): the part of ARM and
the Compute and Network resource providers that slurm-burst's Azure adapter calls,
answered as Azure answers (request and answer shapes from Microsoft's REST reference for
Compute 2024-03-01 and Network 2023-09-01, checked against ``azure-mgmt-compute``'s
models by ``tests/integration/test_azure_emulator.py``).

No emulator on the registries covers Compute (Azurite is storage only). This one serves:

- the client-credentials token exchange (``POST /{tenant}/oauth2/token``, as libcloud's
  driver makes it): a token names its principal, and the rate limits are per principal;
- virtual machine scale sets in a resource group (:mod:`slurm_burst_lab.azurevms`):
  create or update (``PUT``), ``PATCH`` (a scale-out is a new ``sku.capacity``),
  ``GET``, list, ``DELETE``; Flexible orchestration (each VM a plain virtual machine
  named ``{set}_{8 hex}``) and Uniform (``{set}_{instance id}``, read and deleted through
  the set); long-running operations with ``Azure-AsyncOperation`` and ``Location``;
- virtual machines: ``GET`` (``$expand=instanceView``), list in the resource group with
  ``$filter='virtualMachineScaleSet/id' eq '…'`` and ``$expand=instanceView`` in pages
  (``nextLink``), ``DELETE`` (its NIC and OS disk with it where their ``deleteOption``
  says so), ``retrieveBootDiagnosticsData`` (a read-only address of the serial log, served
  here as ``/_blob/…``);
- network interfaces: ``GET`` and list in the resource group, in pages;
- ARM's request limits per subscription and principal (:mod:`slurm_burst_lab.armlimits`):
  the ``x-ms-ratelimit-remaining-subscription-*`` header on every answer, 429 with
  ``Retry-After`` past them;
- capacity a test can refuse per size (``AllocationFailed`` after some VMs, or a quota's
  ``OperationNotAllowed`` at once), faults injected per method;
- Spot: capacity a test refuses or withholds; evictions as ``Preempt`` Scheduled Events
  in each booted VM's own instance metadata service (:mod:`slurm_burst_lab.azureimds`),
  the VM deleted when the event starts; proximity placement groups;
- booting (opt-in, :class:`~slurm_burst_lab.labvms.LabVms`; the lab): each VM becomes a
  namespace VM on the lab's cloud bridge at its NIC's address, running its
  ``customData``, root's authorized keys its ``linuxConfiguration.ssh.publicKeys``, its
  host name its computer name; its serial log is the VM's console. Deleting it halts it;
- a control endpoint for tests and the benchmark (``/_emulator/calls``, ``limits``,
  ``capacity``, ``timeline``, ``vms``, ``spot``, ``market``, ``event``, ``clear``).

Served over plain HTTP on loopback (tests) or TLS with a certificate the lab makes
(``--tls CERT KEY``). Where it is simpler than Azure, docs/providers.md says so.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from slurm_burst_lab.armlimits import HEADER, ArmLimits, kind_of
from slurm_burst_lab.azurevms import Arm, ArmError
from slurm_burst_lab.loopback import Remote, serve, serve_until_sigterm, shut

log = logging.getLogger(__name__)

TENANT = "72f988bf-0000-4000-8000-00000000b001"
SUBSCRIPTION = "5b0c7d2e-0000-4000-8000-00000000b002"
CLIENT = "a1b2c3d4-0000-4000-8000-00000000b003"  # the lab's app (service principal)
SECRET = "lab-only-secret"  # noqa: S105 - the emulator's own, for the lab's principal
# the lab's storage account for boot diagnostics: its read-only account SAS
STORAGE_SIG = "lab-storage-read-only"
STORAGE_SAS = f"sv=2022-11-02&ss=b&srt=o&sp=r&se=2099-01-01T00%3A00%3A00Z&sig={STORAGE_SIG}"
StartResponse = Callable[..., Any]
REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    409: "Conflict",
    429: "Too Many Requests",
}


@dataclass
class Fault:
    method: str
    http: int
    code: str
    message: str
    times: int


class AzureEmulator:
    """ARM for one subscription, as a WSGI app; serve with :meth:`start`."""

    def __init__(
        self,
        limits: float | None = 1.0,
        boot_delay: float = 0.0,
        op_delay: float = 0.0,
        keys_after: float | None = None,
        page: int = 100,
    ) -> None:
        self.limits = ArmLimits(limits) if limits else None
        self.arm = Arm(
            SUBSCRIPTION, boot_delay=boot_delay, op_delay=op_delay, keys_after=keys_after, page=page
        )
        self.calls: Counter[str] = Counter()
        self.timeline: list[tuple[float, str, bool]] = []  # (wall clock, kind, throttled)
        self.called: list[tuple[float, str]] = []  # (wall clock, call): every call counted
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body): the checks
        self.keep_exchanges = False
        self.tokens: dict[str, str] = {}  # access token -> principal
        self._faults: list[Fault] = []
        self._lock = threading.RLock()
        self._server: Any = None
        self.port = 0
        self.base = ""  # scheme://host:port answers link to (nextLink, operations)

    # -- control ----------------------------------------------------------------------
    def start(self, tls: tuple[str, str] | None = None) -> int:
        """Serve on a free loopback port (over TLS with ``tls``: a certificate and its
        key); the port."""
        context = None
        if tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
        self._server = serve(self, "azure-emulator", ssl_context=context)
        self.port = int(self._server.server_port)
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        return self.port

    def stop(self) -> None:
        shut(self._server)
        self._server = None

    def inject(self, method: str, http: int, code: str, message: str = "", times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (``vmss.patch``, ``vm.delete``...) fail
        with ARM's error ``code`` and HTTP status ``http``."""
        with self._lock:
            self._faults.append(Fault(method, http, code, message or f"injected {code}", times))

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()
            self.timeline.clear()
            self.called.clear()
            self.requests.clear()
            self._faults.clear()
            self.arm.room.clear()
            self.arm.set_spot("")
            if self.limits is not None:
                self.limits.clear()

    # -- WSGI -------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        if not self.base:
            scheme = environ.get("wsgi.url_scheme", "http")
            self.base = f"{scheme}://{environ.get('HTTP_HOST', f'127.0.0.1:{self.port}')}"
        headers: list[tuple[str, str]] = []
        try:
            if path.endswith("/oauth2/token") and method == "POST":
                return self._answer(start_response, 200, self._token(path, raw), headers)
            if path.startswith("/_emulator/"):
                return self._answer(start_response, 200, self._control(path[11:], query), [])
            if path.startswith("/_blob/") and method == "GET":
                return self._blob(start_response, path[7:], query)
            if path.startswith("/bootdiagnostics-") and method == "GET":
                return self._storage(start_response, path[1:], query)
            principal = self._principal(environ)
            body = json.loads(raw) if raw else None
            if self.keep_exchanges:
                with self._lock:
                    self.requests.append((method, path, body))
            self._limit(method, principal, headers)
            http, doc, more = self.arm.route(
                method, path, query, body, self.base, lambda name: self._count(name)
            )
            return self._answer(start_response, http, doc, headers + more)
        except ArmError as exc:
            headers += exc.headers
            return self._answer(start_response, exc.http, exc.document(), headers)
        except (ValueError, KeyError, TypeError) as exc:
            err = ArmError(400, "InvalidRequestContent", f"The request content was invalid: {exc}")
            return self._answer(start_response, 400, err.document(), headers)

    def _answer(
        self, start_response: StartResponse, http: int, doc: Any, headers: list[tuple[str, str]]
    ) -> list[bytes]:
        data = b"" if doc is None else json.dumps(doc).encode()
        start_response(
            f"{http} {REASONS.get(http, 'Error')}",
            [
                ("Content-Type", "application/json; charset=utf-8"),
                ("Content-Length", str(len(data))),
                *headers,
            ],
        )
        return [data]

    def _token(self, path: str, raw: bytes) -> dict[str, Any]:
        """Client credentials (libcloud's driver: v1 endpoint, ``resource``)."""
        form = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
        tenant = path.strip("/").split("/")[0]
        if form.get("grant_type") != "client_credentials":
            raise ArmError(400, "unsupported_grant_type", "AADSTS70003: unsupported grant")
        if (
            tenant != TENANT
            or form.get("client_id") != CLIENT
            or form.get("client_secret") != SECRET
        ):
            raise ArmError(401, "invalid_client", "AADSTS7000215: Invalid client secret")
        token = f"eyJ0eXAi.emulator.{uuid.uuid4().hex}"
        with self._lock:
            self.tokens[token] = str(form["client_id"])
            self.calls["token"] += 1
        return {
            "token_type": "Bearer",
            "expires_in": "3599",
            "expires_on": str(int(time.time()) + 3599),
            "resource": form.get("resource", ""),
            "access_token": token,
        }

    def _principal(self, environ: Mapping[str, Any]) -> str:
        auth = str(environ.get("HTTP_AUTHORIZATION", ""))
        principal = self.tokens.get(auth.removeprefix("Bearer "))
        if not auth.startswith("Bearer ") or principal is None:
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.")
        return principal

    def _limit(self, method: str, principal: str, headers: list[tuple[str, str]]) -> None:
        """ARM's buckets: the remaining header, or 429 with Retry-After."""
        kind = kind_of(method)
        now = time.time()
        if self.limits is None:
            headers.append((HEADER.format(kind), str(int(DEFAULT_LEFT[kind]))))
            return
        ok, n = self.limits.take(SUBSCRIPTION, principal, kind, now)
        with self._lock:
            self.timeline.append((now, kind, not ok))
        if not ok:
            raise ArmError(
                429,
                "SubscriptionRequestsThrottled",
                f"Number of '{kind[:-1]}' requests for subscription "
                f"'{SUBSCRIPTION}' actor '{principal}' exceeded. Please try again "
                f"after '{n}' seconds after the additional tokens are available.",
                headers=[("Retry-After", str(n))],
            )
        headers.append((HEADER.format(kind), str(n)))

    def _count(self, name: str) -> None:
        """Count a call of ``name`` and raise a fault injected for it."""
        with self._lock:
            self.calls[name] += 1
            self.called.append((time.time(), name))
            for f in self._faults:
                if f.method == name and f.times > 0:
                    f.times -= 1
                    after = [("Retry-After", "1")] if f.http == 429 else []
                    raise ArmError(f.http, f.code, f.message, headers=after)

    def _blob(self, start_response: StartResponse, rest: str, q: Mapping[str, str]) -> list[bytes]:
        """A VM's serial log by the read-only address ``retrieveBootDiagnosticsData``
        gave (its ``sig`` checked; 404 BlobNotFound while nothing is written)."""
        vm_id = rest.split("/")[0]
        text = self.arm.serial_log(vm_id, q.get("sig", ""))
        with self._lock:
            self.calls["blob.get"] += 1
        if text is None:
            data = b'<?xml version="1.0"?><Error><Code>BlobNotFound</Code></Error>'
            start_response(
                "404 The specified blob does not exist.",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(data)))],
            )
            return [data]
        data = text.encode()
        start_response(
            "200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))]
        )
        return [data]

    def _storage(
        self, start_response: StartResponse, rest: str, q: Mapping[str, str]
    ) -> list[bytes]:
        """The site's storage account (its ``storageUri`` the emulator's own address): a
        boot diagnostics blob read with the account's read-only SAS (:data:`STORAGE_SAS`)."""
        if not secrets.compare_digest(q.get("sig", ""), STORAGE_SIG):
            data = b'<?xml version="1.0"?><Error><Code>AuthenticationFailed</Code></Error>'
            start_response("403 Server failed to authenticate the request.",
                           [("Content-Type", "application/xml"),
                            ("Content-Length", str(len(data)))])  # fmt: skip
            return [data]
        name = rest.rsplit("/", 1)[-1]
        parts = name.split(".")
        text = self.arm.console_of(parts[-3]) if name.endswith(".serialconsole.log") and len(
            parts) >= 4 else None  # fmt: skip
        with self._lock:
            self.calls["storage.get"] += 1
        if text is None:
            data = b'<?xml version="1.0"?><Error><Code>BlobNotFound</Code></Error>'
            start_response("404 The specified blob does not exist.",
                           [("Content-Type", "application/xml"),
                            ("Content-Length", str(len(data)))])  # fmt: skip
            return [data]
        data = text.encode()
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(data)))])  # fmt: skip
        return [data]

    def _control(self, what: str, q: Mapping[str, str]) -> dict[str, Any]:
        """``calls`` (counts by method, throttled answers by kind, the least left of each
        bucket); ``limits?factor=F`` (ARM's buckets times F from now on; 0: none);
        ``capacity?size=S&room=N&code=C`` (at most N more VMs of size S); ``timeline``;
        ``vms`` (every VM: name, set, state); ``spot?mode=refuse|withhold|&code=C``
        (Spot capacity); ``market`` (the Spot mode, VMs withheld and evicted, proximity
        placement groups, acknowledged events); ``event?vm=NAME&type=Preempt&in=S`` (a
        Scheduled Event on a booted VM, starting in S s; a Preempt deletes it then);
        ``clear``."""
        with self._lock:
            if what == "timeline":
                return {"timeline": list(self.timeline)}
            if what == "vms":
                return {"vms": self.arm.summary()}
            if what == "market":
                return self.arm.market()
            if what == "event":
                seconds = float(q.get("in", "30"))
                if not 0 <= seconds <= 3600:
                    raise ArmError(400, "InvalidParameter", f"in={q.get('in')!r}: 0 to 3,600 s")
                return self.arm.schedule_event(q.get("vm", ""), q.get("type", "Preempt"), seconds)
            if what == "spot":
                self.arm.set_spot(q.get("mode", ""), q.get("code", "AllocationFailed"))
                return self.arm.market()
            if what == "clear":
                self.clear()
            elif what == "limits":
                factor = float(q.get("factor", "0"))
                if not (0 <= factor < 1e6):
                    raise ArmError(400, "InvalidParameter", f"limits factor {q.get('factor')!r}")
                self.limits = ArmLimits(factor) if factor else None
            elif what == "capacity":
                self.arm.limit(
                    q.get("size", ""), int(q.get("room", "0")), q.get("code", "AllocationFailed")
                )
            elif what != "calls":
                raise ArmError(404, "NotFound", f"no emulator control {what!r}")
            lim = self.limits
            return {
                "calls": dict(self.calls),
                "throttled": dict(lim.throttled) if lim else {},
                "lowest": dict(lim.lowest) if lim else {},
            }


# what the header says when limits are off (ARM's bucket sizes, as if never touched)
DEFAULT_LEFT = {"reads": 249, "writes": 199, "deletes": 199}


class RemoteAzureEmulator(Remote):
    """The emulator in another process (the benchmark): ARM's limits times ``limits``,
    VMs starting for ``boot`` s, their serial logs written ``keys_after`` s after that."""

    def __init__(self, limits: float, boot: float, keys_after: float, op_delay: float) -> None:
        args = [
            "--limits",
            str(limits),
            "--boot-delay",
            str(boot),
            "--keys-after",
            str(keys_after),
            "--op-delay",
            str(op_delay),
        ]
        super().__init__("slurm_burst_lab.azureemu", args, "Azure emulator")

    def timeline(self) -> list[tuple[float, str, bool]]:
        return [(float(t), str(m), bool(x)) for t, m, x in self.get("timeline")["timeline"]]


def main(argv: list[str] | None = None) -> None:
    """``python -m slurm_burst_lab.azureemu PORT``: ARM for the lab's subscription on
    127.0.0.1:PORT; ``--limits F``: ARM's buckets times F (0: none); ``--boot-delay S``:
    VMs starting for S s; ``--boot STATE_DIR``: VMs boot as namespace VMs (the lab);
    ``--tls CERT KEY``: serve HTTPS; SIGTERM halts the VMs."""
    import argparse
    import ipaddress
    import ssl

    from slurm_burst_lab.labvms import LabVms

    ap = argparse.ArgumentParser(prog="python -m slurm_burst_lab.azureemu")
    ap.add_argument("port", type=int)
    ap.add_argument("--limits", type=float, default=1.0, metavar="F")
    ap.add_argument("--boot-delay", type=float, default=0.0)
    ap.add_argument("--op-delay", type=float, default=0.0)
    ap.add_argument("--keys-after", type=float, default=None, metavar="S")
    ap.add_argument("--boot", metavar="STATE_DIR", default="")
    ap.add_argument("--bridge", default="sbl-inet")
    ap.add_argument("--range", dest="vm_range", default="10.252.1.0/24")
    ap.add_argument("--vm-delay", type=float, default=2.0)
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), default=None)
    ap.add_argument("--hide", action="append", default=[])
    args = ap.parse_args(argv)
    for name in ("limits", "boot_delay", "op_delay"):
        if not 0 <= getattr(args, name) < 86400:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: from 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    emu = AzureEmulator(
        limits=args.limits or None,
        boot_delay=args.boot_delay,
        op_delay=args.op_delay,
        keys_after=args.keys_after,
    )
    vms: LabVms | None = None
    if args.boot:
        net = ipaddress.IPv4Network(args.vm_range)
        vms = LabVms(args.boot, args.bridge, str(net), args.vm_delay, tuple(args.hide))
        vms.ensure_network()
        emu.arm.boot_on(vms, net)
    context = None
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*args.tls)
    emu.port = args.port
    emu.base = f"{'https' if context else 'http'}://127.0.0.1:{args.port}"
    serve_until_sigterm(emu, args.port, vms, context)


if __name__ == "__main__":
    main()
