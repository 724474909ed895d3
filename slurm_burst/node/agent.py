"""slurm-burst's node agent: direct WireGuard tunnels to the node's cloud peers, and the
provider's notice of a reclaim, passed on to the daemon.

Started by the bootstrap (``agent-start``) on a node whose group has
``cloud_to_cloud = "wireguard"``; standard library only, as root. The direct tunnels
live on an interface of their own (``--direct``, the node's WireGuard key, listening on
``mesh.node_port``) beside the tunnel to the hub, so what goes where is the routing
table's choice, one route per peer. Every INTERVAL seconds the agent asks the daemon's
node API (over the tunnel to the hub) for its direct peers, saying where its own tunnel
listens, and brings the direct interface in line:

- a new peer is added with its mesh address, endpoint and a keepalive: the handshake
  starts, and a packet the peer sends directly is taken at once;
- the node's own traffic to the peer is routed to the direct interface only once the
  peer has answered (a handshake in the last 3 minutes); until then, and whenever the
  peer stops answering (a security group that does not let ``mesh.node_port`` in), it
  goes through the hub as before: nothing is ever sent into a tunnel that is not up;
- a peer no longer offered is removed, with its route.

Notices (``--imds``: EC2; ``--gce-metadata``: GCE; ``--azure-metadata``: Azure) are
read where the provider serves them to the instance and told to the daemon's node API
once (``POST /v1/notice``). EC2's spot ``instance-action`` is looked at every
``--notice-interval`` seconds (EC2 asks for every 5), and so are Azure's Scheduled
Events (those naming this VM; each one handled is acknowledged once the daemon has
requeued the node's jobs). Google's metadata server is not polled: one thread per
key (``instance/preempted``, ``instance/maintenance-event``) reads it once, then asks
again with ``wait_for_change=true`` and the ETag it last saw, and the server answers when
the value changes (or after ``timeout_sec``, when it asks again).

It never exits on a failed request or command: it says so on stderr and tries again
next round. The private key stays in its file; ``wg`` reads it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

FRESH = 180  # seconds: a handshake this recent means the peer has us too
KEEPALIVE = 25
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def wg(*argv: str) -> str:
    return subprocess.run(["wg", *argv], check=True, capture_output=True, text=True,
                          timeout=10).stdout  # fmt: skip


def own_endpoint(hub: str, port: int) -> str:
    """This node's private address (the source of its route towards the hub's
    endpoint: the interface its tunnels use) and the tunnel port."""
    said = subprocess.run(["ip", "-o", "route", "get", hub], check=True, capture_output=True,
                          text=True, timeout=10).stdout.split()  # fmt: skip
    return f"{said[said.index('src') + 1]}:{port}"


def hub_endpoint(iface: str) -> str:
    """Where the hub's tunnel ends: the one peer of the interface to the hub."""
    for line in wg("show", iface, "endpoints").splitlines():
        _key, _, endpoint = line.partition("\t")
        if endpoint and endpoint != "(none)":
            return endpoint.rpartition(":")[0].strip("[]")
    raise RuntimeError(f"{iface}: the hub's peer has no endpoint")


def current(iface: str) -> dict[str, dict[str, Any]]:
    """The interface's peers: key -> allowed addresses, endpoint, latest handshake."""
    out: dict[str, dict[str, Any]] = {}
    for line in wg("show", iface, "dump").splitlines()[1:]:  # the first: the interface
        f = line.split("\t")
        if len(f) >= 8:
            allowed = [] if f[3] == "(none)" else f[3].split(",")
            out[f[0]] = {"allowed": allowed, "endpoint": f[2], "handshake": int(f[4] or 0)}
    return out


def routed(direct: str) -> set[str]:
    """The addresses routed to the direct interface."""
    said = ip("-o", "route", "show", "dev", direct)
    return {line.split()[0].removesuffix("/32") for line in said.splitlines() if line.strip()}


def ip(*argv: str) -> str:
    return subprocess.run(["ip", *argv], check=True, capture_output=True, text=True,
                          timeout=10).stdout  # fmt: skip


def ensure_direct(direct: str, iface: str, port: int) -> None:
    """The direct interface, up, with the node's key and the tunnel port (once)."""
    if subprocess.run(["ip", "link", "show", "dev", direct], capture_output=True,
                      timeout=10).returncode != 0:  # fmt: skip
        made = subprocess.run(["ip", "link", "add", "dev", direct, "type", "wireguard"],
                              capture_output=True, timeout=10)  # fmt: skip
        if made.returncode != 0:  # no kernel module: the userspace implementation
            env = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1", "PATH": PATH}
            subprocess.run(["wireguard-go", direct], check=True, env=env, timeout=30)
    wg("set", direct, "private-key", f"/etc/wireguard/{iface}.key", "listen-port", str(port))
    ip("link", "set", "dev", direct, "up")
    no_source_check(direct, iface)


def no_source_check(direct: str, iface: str) -> None:
    """No reverse-path filtering on the two tunnels. While two nodes' routes to each
    other disagree (one routes the other directly, the other not yet), a node's packets
    arrive on one tunnel and its answers leave by the other, which the kernel's source
    check drops, in loose mode too (seen in the lab). WireGuard checks every packet's
    source against its peer's key already. The kernel applies the larger of ``all`` and
    the interface's value, so ``all`` goes to 0 as well where an image set it (said)."""
    for name in ("all", iface, direct):
        path = f"/proc/sys/net/ipv4/conf/{name}/rp_filter"
        try:
            with open(path) as fh:
                if fh.read().strip() == "0":
                    continue
            with open(path, "w") as fh:
                fh.write("0\n")
            say(f"rp_filter of {name} set to 0 (the tunnels' sources are WireGuard's to check)")
        except OSError as exc:  # a read-only /proc/sys: mismatched routes drop for a while
            say(f"rp_filter of {name} left as it is: {exc}")


def ask(api: str, endpoint: str) -> dict[str, Any]:
    data = json.loads(fetch(f"{api}/v1/peers?{urllib.parse.urlencode({'endpoint': endpoint})}"))
    if not isinstance(data, dict) or not isinstance(data.get("peers"), list):
        raise ValueError("the node API's answer has no peer list")
    return data


def sync(direct: str, source: str, said: dict[str, Any], now: float) -> list[str]:
    """Bring the direct interface in line with ``said``; what was done."""
    wanted = {str(p["key"]): p for p in said["peers"] if isinstance(p, dict) and p.get("key")}
    have = current(direct)
    routes = routed(direct)
    done = []
    for key, peer in have.items():
        if key not in wanted:
            for address in peer["allowed"]:
                if address.removesuffix("/32") in routes:
                    ip("route", "del", address, "dev", direct)
            wg("set", direct, "peer", key, "remove")
            done.append(f"removed {key[:8]}")
    for key, p in wanted.items():
        address = str(p["address"])
        seen = have.get(key)
        if (
            seen is None
            or seen["endpoint"] != p["endpoint"]
            or seen["allowed"] != [f"{address}/32"]
        ):
            wg("set", direct, "peer", key, "endpoint", str(p["endpoint"]),
               "allowed-ips", f"{address}/32", "persistent-keepalive", str(KEEPALIVE))  # fmt: skip
            done.append(f"added {p['node']} at {p['endpoint']}")
            continue
        answered = bool(seen["handshake"]) and now - seen["handshake"] < FRESH
        if answered and address not in routes:
            ip("route", "replace", f"{address}/32", "dev", direct, "src", source)
            done.append(f"{p['node']} now direct")
        elif not answered and address in routes:
            ip("route", "del", f"{address}/32", "dev", direct)
            done.append(f"{p['node']} back through the hub (no handshake)")
    return done


def fetch(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    timeout: float = 10.0,
    most: int = 1 << 20,
) -> bytes:
    """One HTTP request (http:// only: the hub's node API and the link-local metadata
    service); at most ``most`` bytes of the answer. HTTPError for a non-2xx answer."""
    if not url.startswith("http://"):
        raise ValueError(f"{url[:60]!r}: only http:// is asked here")
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})  # noqa: S310
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - checked above
        return bytes(r.read(most))


class Notices:
    """The provider's interruption notice, read as EC2 documents it (IMDSv2: a session
    token, then ``spot/instance-action``: 404 until the instance is to be reclaimed),
    and told to the daemon once."""

    def __init__(self, imds: str, api: str) -> None:
        self.imds = imds.rstrip("/")
        self.api = api
        self.token = ""
        self.told = False

    def look(self) -> str:
        if self.told:
            return ""
        notice = self._read()
        if notice is None:
            return ""
        body = json.dumps({"action": notice.get("action", ""), "time": notice.get("time", "")})
        fetch(f"{self.api}/v1/notice", "POST", {"Content-Type": "application/json"},
              body.encode())  # fmt: skip
        self.told = True
        return f"interruption notice told to the daemon: {body}"

    def _read(self) -> dict[str, Any] | None:
        for _ in range(2):  # a stale token is made again once
            if not self.token:
                self.token = fetch(f"{self.imds}/latest/api/token", "PUT",
                                   {"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
                                   timeout=2, most=256).decode().strip()  # fmt: skip
            try:
                said = fetch(
                    f"{self.imds}/latest/meta-data/spot/instance-action",
                    headers={"X-aws-ec2-metadata-token": self.token},
                    timeout=2,
                )
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code != 401:
                    raise
                self.token = ""
                continue
            notice = json.loads(said)
            return notice if isinstance(notice, dict) else None
        return None


class AzureNotices:
    """Azure's Scheduled Events (the instance metadata service, ``Metadata: true``): a
    ``Preempt`` (a Spot eviction), ``Terminate``, ``Reboot`` or ``Redeploy`` naming this
    VM is told to the daemon once, as ``{"action": EventType, "time": NotBefore}``; each
    such event is acknowledged (``StartRequests``) once the daemon has requeued the
    node's jobs (the answer's ``requeue_at``, and the jobs' time to leave), not before:
    an acknowledged event may start at once. ``Freeze`` (a pause of seconds) is left."""

    API = "api-version=2020-07-01"
    TYPES = ("Preempt", "Terminate", "Reboot", "Redeploy")
    LEAVE = 10.0  # seconds after the requeue before the event is acknowledged
    ACK_MOST = 900.0  # an answer's requeue_at further off than this is not waited for

    def __init__(self, base: str, api: str) -> None:
        self.base = base.rstrip("/")
        self.api = api
        self.name = ""
        self.told = False
        self.acks: dict[str, float] = {}  # event id -> when to acknowledge it
        self.acked: set[str] = set()

    def _get(self, path: str) -> bytes:
        return fetch(f"{self.base}{path}", headers={"Metadata": "true"}, timeout=5,
                     most=1 << 18)  # fmt: skip

    def look(self) -> str:
        """One round: the events read, a new one told, the due ones acknowledged."""
        if not self.name:
            self.name = self._get("/metadata/instance/compute/name?api-version=2021-02-01"
                                  "&format=text").decode("utf-8", "replace").strip()  # fmt: skip
        doc = json.loads(self._get(f"/metadata/scheduledevents?{self.API}"))
        events = doc.get("Events") if isinstance(doc, dict) else None
        said = []
        for ev in events if isinstance(events, list) else []:
            if not isinstance(ev, dict) or ev.get("EventType") not in self.TYPES:
                continue
            resources = ev.get("Resources")
            event_id = str(ev.get("EventId", ""))[:64]
            if not event_id or not isinstance(resources, list) or self.name not in resources:
                continue
            if event_id in self.acks or event_id in self.acked:
                continue
            said.append(self._tell(event_id, str(ev["EventType"]), ev.get("NotBefore", "")))
        said += self._acknowledge(time.time())
        return "; ".join(s for s in said if s)

    def _tell(self, event_id: str, kind: str, not_before: object) -> str:
        """Tell the daemon (the first event only: it reclaims the node whatever follows);
        when to acknowledge the event."""
        when = time.time() + self.LEAVE
        line = ""
        if not self.told:
            body = json.dumps({"action": kind, "time": not_before if isinstance(not_before, str)
                               else ""}).encode()  # fmt: skip
            answer = json.loads(fetch(f"{self.api}/v1/notice", "POST",
                                      {"Content-Type": "application/json"}, body))  # fmt: skip
            self.told = True
            at = answer.get("requeue_at") if isinstance(answer, dict) else None
            if isinstance(at, int | float) and at - time.time() < self.ACK_MOST:
                when = max(when, float(at) + self.LEAVE)
            line = f"{kind} event {event_id} told to the daemon"
        self.acks[event_id] = when
        return line

    def _acknowledge(self, now: float) -> list[str]:
        due = [e for e, at in self.acks.items() if at <= now]
        if not due:
            return []
        body = json.dumps({"StartRequests": [{"EventId": e} for e in due]}).encode()
        fetch(f"{self.base}/metadata/scheduledevents?{self.API}", "POST",
              {"Metadata": "true", "Content-Type": "application/json"}, body)  # fmt: skip
        for e in due:
            del self.acks[e]
            self.acked.add(e)
        return [f"event {e} acknowledged" for e in due]


class GceNotices:
    """GCE's notices (Google's metadata server, ``Metadata-Flavor: Google``): a preemption
    (``instance/preempted`` TRUE) or a host maintenance that will terminate the instance
    (``instance/maintenance-event`` TERMINATE_ON_HOST_MAINTENANCE), each waited on in a
    thread of its own and told to the daemon once, as ``{"action": "preempted"}`` or
    ``{"action": "maintenance"}`` (the daemon counts the lead from when it hears)."""

    KEYS = {"preempted": ("TRUE", "preempted"),
            "maintenance-event": ("TERMINATE_ON_HOST_MAINTENANCE", "maintenance")}  # fmt: skip
    WAIT = 300  # timeout_sec of one wait (the server answers at a change, or then)
    RETRY = 2.0  # seconds after a failed read

    def __init__(self, base: str, api: str) -> None:
        self.base = base.rstrip("/")
        self.api = api
        self.told = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        for key in self.KEYS:
            threading.Thread(target=self.watch, args=(key,), name=f"gce-{key}",
                             daemon=True).start()  # fmt: skip

    def read(self, key: str, wait: bool = False, etag: str = "") -> tuple[str, str]:
        """(value, ETag) of ``instance/<key>``; ``wait``: once it changes (from ``etag``
        where one is known, else from the value when asked), or after WAIT seconds."""
        url = f"{self.base}/computeMetadata/v1/instance/{key}"
        timeout = 10.0
        if wait:
            query = {"wait_for_change": "true", "timeout_sec": str(self.WAIT)}
            if etag:
                query["last_etag"] = etag
            url += "?" + urllib.parse.urlencode(query)
            timeout = self.WAIT + 30.0
        if not url.startswith("http://"):
            raise ValueError(f"{url[:60]!r}: only http:// is asked here")
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})  # noqa: S310
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - checked above
            if r.headers.get("Metadata-Flavor") != "Google":
                raise ValueError(f"{url}: the answer is not the metadata server's")
            return r.read(256).decode("ascii", "replace").strip(), r.headers.get("ETag") or ""

    def look(self, key: str, wait: bool = False, etag: str = "") -> tuple[bool, str]:
        """One read (waiting for a change if ``wait``); (told, the ETag to wait on next)."""
        value, etag = self.read(key, wait, etag)
        wanted, action = self.KEYS[key]
        if value != wanted:
            return False, etag
        return self.tell(action), etag

    def tell(self, action: str) -> bool:
        """Tell the daemon (once, whichever key said it first); True once told."""
        with self._lock:
            if self.told.is_set():
                return True
            body = json.dumps({"action": action}).encode()
            fetch(f"{self.api}/v1/notice", "POST", {"Content-Type": "application/json"}, body)
            self.told.set()
        say(f"{action} notice told to the daemon")
        return True

    def watch(self, key: str) -> None:
        """Read ``key`` now, then wait on it for as long as nothing is told."""
        waiting, etag = False, ""
        while not self.told.is_set():
            try:
                done, etag = self.look(key, waiting, etag)
                if done:
                    return
                waiting = True
            except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
                say(f"notice {key}: {type(exc).__name__}: {exc}")
                waiting, etag = False, ""  # read afresh: a change may have come meanwhile
                time.sleep(self.RETRY)


def say(line: str) -> None:
    print(f"slurm-burst-agent: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="slurm-burst-agent")
    ap.add_argument("--iface", required=True, help="the tunnel to the hub")
    ap.add_argument("--api", required=True, help="http://HUB-MESH-ADDRESS:PORT")
    ap.add_argument("--direct", default="", help="the direct tunnels' interface ('': none)")
    ap.add_argument("--address", default="", help="this node's mesh address (with --direct)")
    ap.add_argument("--port", type=int, default=0, help="this node's tunnel port")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between peer reads")
    ap.add_argument("--imds", default="", help="the instance metadata service ('': no notices)")
    ap.add_argument("--notice-interval", type=float, default=2.0)
    ap.add_argument("--gce-metadata", default="",
                    help="GCE's metadata server: its notices, waited on ('': none)")  # fmt: skip
    ap.add_argument(
        "--azure-metadata",
        default="",
        help="Azure's instance metadata service: its Scheduled Events ('': none)",
    )
    ap.add_argument("--once", action="store_true", help="one round, then exit")
    args = ap.parse_args(argv)
    notices: Notices | AzureNotices | None = None
    if args.imds:
        notices = Notices(args.imds, args.api)
    elif args.azure_metadata:
        notices = AzureNotices(args.azure_metadata, args.api)
    gce = GceNotices(args.gce_metadata, args.api) if args.gce_metadata else None
    if gce is not None and not args.once:
        gce.start()
    endpoint = ""
    tick = min(args.interval if args.direct else 3600.0,
               args.notice_interval if notices else 3600.0)  # fmt: skip
    next_sync = 0.0
    while True:
        now = time.monotonic()
        if notices is not None:
            try:
                if line := notices.look():
                    say(line)
            except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
                say(f"notice: {type(exc).__name__}: {exc}")
        if args.direct and now >= next_sync:
            next_sync = now + args.interval
            try:
                if not endpoint:
                    ensure_direct(args.direct, args.iface, args.port)
                    endpoint = own_endpoint(hub_endpoint(args.iface), args.port)
                for line in sync(args.direct, args.address, ask(args.api, endpoint), time.time()):
                    say(line)
            except (OSError, ValueError, KeyError, RuntimeError,
                    subprocess.SubprocessError) as exc:  # fmt: skip
                say(f"peers: {type(exc).__name__}: {exc}")
        if args.once:
            if gce is not None:
                for key in gce.KEYS:
                    gce.look(key)
            return 0
        time.sleep(tick)


if __name__ == "__main__":
    sys.exit(main())
