"""``slurm-burst daemon | nodes | events``: run the provisioning daemon and look at it."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any

import click

from slurm_burst.cli.common import (
    EXIT_FAILED,
    EXIT_PRECONDITION,
    app,
    emit,
    fail,
    json_option,
    redact_logs,
    state_store,
    ts,
)
from slurm_burst.fileio import open_append


@click.command("daemon")
@click.option(
    "--node-id",
    metavar="NAME",
    help="This daemon's name in the HA election and in status (default: daemon.node_id "
    "or the host name).",
)
@click.pass_context
def daemon(ctx: click.Context, node_id: str | None) -> None:
    """Run the provisioning daemon in the foreground (systemd: slurm-burst.service).

    \b
    Takes the resume/suspend requests the hooks record, launches instances
    through libcloud, bootstraps them over SSH and WireGuard, and tears them
    down. Logs to daemon.log_file (or standard error). SIGTERM stops it; a
    restart carries on from the state database. With daemon.ha_url set, the
    daemon stands by until it holds the cluster's PostgreSQL advisory lock.
    Exit 3 when another daemon holds the host lock, 1 when set-up fails (hub,
    keys, database) or when it lost the HA lock (its supervisor restarts it
    as a standby).
    """
    import dataclasses

    from slurm_burst.wiring import daemon, storage

    cfg = app(ctx).config
    if node_id:
        cfg = dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, node_id=node_id))
    _daemon_logging(cfg.daemon.log_file, app(ctx).verbose)
    _descriptors(storage.descriptor_budget(cfg))
    try:
        d = daemon.daemon(cfg)
    except (OSError, RuntimeError) as exc:
        fail(f"daemon set-up failed: {exc}", EXIT_FAILED)

    def stop(signum: int, frame: Any) -> None:
        logging.getLogger(__name__).info("daemon.signal %s", signal.Signals(signum).name)
        d.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    d.run()  # a DaemonError (another daemon holds the lock) exits 3, as every error: main.py
    if d.lost_leadership:
        fail("lost the HA lock: stopped acting; restart to stand by", EXIT_FAILED)


def _descriptors(budget: int) -> None:
    """Raise the soft descriptor limit to the hard one (the unit sets LimitNOFILE); warn
    when the daemon's servers' connection budget is not well under it."""
    import resource

    log = logging.getLogger(__name__)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("daemon.descriptors_not_raised limit=%d error=%s", soft, exc)
    level = logging.INFO if soft >= 4 * budget else logging.WARNING
    log.log(
        level,
        "daemon.descriptors limit=%d servers_budget=%d%s",
        soft,
        budget,
        "" if level == logging.INFO else " (set LimitNOFILE= in the unit above 4x it)",
    )


def _daemon_logging(path: str, verbose: int) -> None:
    try:  # the daemon's alone (its group may read); never through a link, never a device
        handler: logging.Handler = (
            logging.StreamHandler(os.fdopen(open_append(path, 0o640), "a", encoding="utf-8"))
            if path
            else logging.StreamHandler()
        )
    except OSError as exc:
        fail(f"cannot open daemon.log_file {path}: {exc.strerror or exc}", EXIT_PRECONDITION)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    redact_logs()
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
    for noisy in ("paramiko", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@click.command("nodes")
@json_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Cloud nodes the daemon knows: state, instance, addresses, last error."""
    store = state_store(ctx)
    recs = [r.as_dict() for r in store.nodes()]
    beat = store.heartbeat()
    if as_json:
        emit({"nodes": recs, "heartbeat": beat}, True)
        return
    emit(
        recs,
        False,
        columns=["NODE", "GROUP", "STATE", "WANT", "SINCE", "INSTANCE", "ADDRESS", "MESH", "ERROR"],
        rows=lambda rs: [
            [
                r["name"],
                r["group"],
                r["state"],
                r["want"],
                ts(r["state_since"]),
                r["instance_id"],
                r["ip"],
                r["mesh_addr"],
                r["error"],
            ]
            for r in rs
        ],
        title="slurm-burst nodes",
    )
    if beat is None:
        click.echo("daemon: never ran", err=True)
    else:
        click.echo(
            f"daemon: pid {beat.get('pid')}, heartbeat {time.time() - beat['at']:.0f} s ago",
            err=True,
        )


@click.command("events")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events.")
@click.option("--node", help="Only events of this node.")
@json_option
@click.pass_context
def events(ctx: click.Context, follow: bool, node: str | None, as_json: bool) -> None:
    """Node state changes and daemon events, oldest first."""
    store = state_store(ctx)
    last = 0
    while True:
        batch = store.events(last)  # at most 1,000 at a time
        if batch:
            last = batch[-1]["id"]
        for e in batch:
            if node is not None and e["node"] != node:
                continue
            if as_json:
                click.echo(json.dumps(e, sort_keys=True))
            else:
                click.echo(f"{ts(e['at'])}  {e['node']:<16} {e['event']:<24} {e['detail']}")
        if batch:
            continue  # drain what is there before waiting
        if not follow:
            return
        sys.stdout.flush()
        time.sleep(1.0)
