"""An EC2 API emulator on loopback: moto's EC2 server behind a WSGI wrapper (tests, the lab).

libcloud's own EC2 driver talks to it over HTTP with SigV4, exactly as it talks to
AWS. The wrapper makes moto answer the way EC2 does where it differs, and nothing
more (see ../shared/docs/LAB-NOTES.md):

- the XML namespace: moto answers ``.../doc/2016-11-15``, EC2 ``.../doc/2016-11-15/``
  (libcloud parses with the latter);
- ``ClientToken`` idempotency of RunInstances, which moto does not implement: the
  same token with the same parameters returns the first answer (the same
  reservation), with other parameters ``IdempotentParameterMismatch``, as EC2 does;
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

- Booting (opt-in, :class:`~slurm_burst_lab.ec2vms.Ec2Vms`): each instance becomes a
  namespace VM at its private IP. Instances launched without a subnet go to the
  emulator's default subnet (``default_subnet``), a range of the lab bridge's subnet.

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

from slurm_burst_lab.ec2vms import Ec2Vms

NS_MOTO = b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15"'
NS_EC2 = b'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
# parameters that differ between two sends of the same request
_VOLATILE = {"Signature", "SignatureMethod", "SignatureVersion", "Timestamp", "AWSAccessKeyId"}

StartResponse = Callable[..., Any]


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

    def __init__(self, serialize: bool = True) -> None:
        from moto.server import create_backend_app  # type: ignore[attr-defined]

        self._app = create_backend_app("ec2")
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
        self.vms: Ec2Vms | None = None  # instances boot as VMs (the lab)
        self.default_subnet = ""  # SubnetId for a RunInstances that names none

    # -- control --------------------------------------------------------------
    def start(self) -> int:
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = make_server("127.0.0.1", 0, self, threaded=True)
        self.port = int(self._server.server_port)
        threading.Thread(
            target=self._server.serve_forever, name="ec2-emulator", daemon=True
        ).start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def inject(
        self, action: str, code: str, http: int = 400, times: int = 1, message: str = ""
    ) -> None:
        """The next ``times`` calls of ``action`` fail with EC2's error ``code``."""
        with self._lock:
            self._faults.append(Fault(action, code, message or f"injected {code}", http, times))

    def limit(self, instance_type: str, room: int) -> None:
        """Calls of RunInstances for ``instance_type`` make at most ``room`` instances."""
        with self._lock:
            self._room[instance_type] = room

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._room.clear()
            self.calls.clear()

    def driver(self, region: str = "us-east-1") -> Any:
        """libcloud's EC2 driver pointed at the emulator (SigV4, plain HTTP)."""
        from libcloud.compute.drivers.ec2 import EC2NodeDriver

        return EC2NodeDriver(  # type: ignore[no-untyped-call]
            "AKIDEMULATOR000000000",
            "emulator-secret",
            region=region,
            secure=False,
            host="127.0.0.1",
            port=self.port,
            signature_version="4",
        )

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
        if fault is not None:
            return self._answer(start_response, f"{fault.http} ERROR", [], error_document(
                fault.code, fault.message))  # fmt: skip
        if action == "GetConsoleOutput":
            return self._console(start_response, args)
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
            refused = self._within(environ, params, room)
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
            out = b"".join(self._app(environ, capture)).replace(NS_MOTO, NS_EC2)
        if not captured["status"].startswith("2"):
            out = _as_ec2_error(out)
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
            self.vms.import_key(args.get("KeyName", ""), args.get("PublicKeyMaterial", ""))
        elif self.vms is not None and action == "TerminateInstances":
            for key, value in params:
                if key.startswith("InstanceId."):
                    self.vms.halt(value)

    def _made(self, args: dict[str, str], answer: bytes) -> None:
        """Note each new instance's type and birth; boot its VM if booting is on."""
        from xml.etree import ElementTree

        ns = {"e": NS_EC2.decode().split('"')[1]}
        now = time.monotonic()
        root = ElementTree.fromstring(answer)  # noqa: S314 - moto's own answer, not input
        for item in root.iterfind("e:instancesSet/e:item", ns):
            iid = item.findtext("e:instanceId", "", ns)
            with self._lock:
                self.made.setdefault(iid, (item.findtext("e:instanceType", "", ns), now))
            if self.vms is not None:
                ip = item.findtext("e:privateIpAddress", "", ns)
                self.vms.boot(
                    iid, ip, args.get("UserData", ""), args.get("KeyName", ""),
                    args.get("ImageId", ""),
                )  # fmt: skip

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
        POST /_emulator/inject?action=&code=&http=&times=."""
        path = environ["PATH_INFO"].removeprefix("/_emulator/")
        args = dict(parse_qsl(environ.get("QUERY_STRING", "")))
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


class RemoteEmulator:
    """An emulator serving in another process (``python -m slurm_burst_lab.ec2emu``), as
    EC2 is another service: its calls counted and faults injected over HTTP."""

    def __init__(self) -> None:
        import socket
        import subprocess
        import sys

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_burst_lab.ec2emu", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import time

        deadline = time.monotonic() + 60
        while True:
            try:
                self.calls()
                return
            except OSError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("the EC2 emulator did not start") from None
                time.sleep(0.2)

    def _get(self, path: str) -> dict[str, int]:
        import urllib.request

        url = f"http://127.0.0.1:{self.port}/_emulator/{path}"
        with urllib.request.urlopen(url, timeout=30) as r:
            return dict(json.loads(r.read()))

    def calls(self) -> dict[str, int]:
        return self._get("calls")

    def clear(self) -> None:
        self._get("clear")

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)


def boot_vms(emu: Ec2Emulator, vms: Ec2Vms, vm_range: str) -> None:
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
    import signal

    from werkzeug.serving import make_server

    ap = argparse.ArgumentParser(prog="python -m slurm_burst_lab.ec2emu")
    ap.add_argument("port", type=int)
    ap.add_argument("--boot", metavar="STATE_DIR", default="")
    ap.add_argument("--bridge", default="sbl-inet")
    ap.add_argument("--subnet", default="10.251.0.0/24", help="the bridge's subnet")
    ap.add_argument("--range", dest="vm_range", default="10.251.0.128/25")
    ap.add_argument("--boot-delay", type=float, default=2.0)
    ap.add_argument("--hide", action="append", default=[])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    emu = Ec2Emulator(serialize=bool(args.boot))
    server = make_server("127.0.0.1", args.port, emu, threaded=True)
    emu.port = args.port
    vms: Ec2Vms | None = None
    if args.boot:
        vms = Ec2Vms(args.boot, args.bridge, args.subnet, args.boot_delay, tuple(args.hide))
        threading.Thread(target=lambda: boot_vms(emu, vms, args.vm_range), daemon=True).start()

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    finally:
        if vms is not None:
            vms.halt_all()


if __name__ == "__main__":
    main()
