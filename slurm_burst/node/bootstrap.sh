#!/bin/sh
# slurm-burst node bootstrap: run on a cloud node over SSH by the daemon, one step at a
# time (sh bootstrap.sh STEP ARGS...). Every step is idempotent: running it again
# on a node where it already happened changes nothing. No secret passes through argv:
# the munge key arrives by SFTP; the WireGuard private key is made here and never leaves.
set -eu
step=$1; shift
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

case "$step" in
wg-key)
    # wg-key IFACE: make the node's WireGuard key pair (once); print the public key.
    iface=$1
    umask 077
    install -d -m 0700 /etc/wireguard
    [ -s "/etc/wireguard/$iface.key" ] || wg genkey > "/etc/wireguard/$iface.key"
    chmod 0600 "/etc/wireguard/$iface.key"
    wg pubkey < "/etc/wireguard/$iface.key"
    ;;
wg-up)
    # wg-up IFACE ADDRESS/PREFIX CONF [ROUTE...]: bring the tunnel up with CONF (no private
    # key in it) plus the key made by wg-key; route ROUTEs (the controller) through it.
    iface=$1; addr=$2; conf=$3; shift 3
    if ! ip link show dev "$iface" >/dev/null 2>&1; then
        ip link add dev "$iface" type wireguard 2>/dev/null || \
            WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1 wireguard-go "$iface"
    fi
    # link up first: the keepalive that starts the handshake must not be dropped
    ip address replace "$addr" dev "$iface"
    ip link set dev "$iface" up
    # key and peer in one setconf (the key through a pipe, never argv): a peer without
    # a key would send its first handshake too early and wait 5 s to retry
    { printf '[Interface]\nPrivateKey = '; cat "/etc/wireguard/$iface.key"; cat "$conf"; } \
        | wg setconf "$iface" /dev/stdin
    for route in "$@"; do
        ip route replace "$route" dev "$iface" src "${addr%/*}"
    done
    ;;
munge-dirs)
    # munge-dirs: directories munged needs; print munge's uid:gid for the key's owner.
    install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 /run/munge
    echo "$(id -u munge):$(id -g munge)"
    ;;
munge-start)
    # munge-start SOCKET: start munged on SOCKET (once) and wait for the socket.
    sock=$1
    install -d -o munge -g munge -m 0755 "$(dirname "$sock")"
    if [ ! -S "$sock" ] || ! munge -n --socket="$sock" >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged --socket="$sock" --force
    fi
    i=0
    until munge -n --socket="$sock" >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt 100 ] || { echo "munged did not answer on $sock" >&2; exit 1; }
        sleep 0.1
    done
    # configless slurmd authenticates its first request (fetching slurm.conf, which holds
    # AuthInfo) through munge's default socket: make that path reach this munged too
    if [ "$sock" != /run/munge/munge.socket.2 ]; then
        ln -sfn "$sock" /run/munge/munge.socket.2
    fi
    ;;
slurmd-version)
    # slurmd-version: the node's slurmd release (checked against slurmctld's first)
    slurmd -V
    ;;
gpu-prepare)
    # gpu-prepare: the directory the GPU check and its expectation file live in
    install -d -m 0755 /etc/slurm-burst
    ;;
gpu-check)
    # gpu-check PYTHON: run the GPU check (gpucheck.py, copied by the daemon with its
    # expectation file); its JSON report goes to stdout whatever it found: the daemon judges
    python=$1
    if [ ! -x "$python" ]; then
        echo "{\"ok\": false, \"problems\": [\"no $python on the node (Python with nvidia-ml-py)\"]}"
        exit 0
    fi
    "$python" /etc/slurm-burst/gpucheck.py check </dev/null || true
    ;;
runtime-capture)
    # runtime-capture: this node's runtime manifest, the fields and items of the group's
    # reference (runtime.py and the reference, copied by the daemon); the daemon judges
    python3 /etc/slurm-burst/runtime.py capture --like /etc/slurm-burst/runtime-reference.json </dev/null
    ;;
image-load)
    # image-load DIR REF DIGEST: the image layout pulled to DIR checked to be DIGEST
    # alone and loaded into podman as REF (images.py, copied by the daemon); its JSON
    # answer goes to stdout whatever it found: the daemon judges
    python3 /etc/slurm-burst/images.py load --dir "$1" --ref "$2" --digest "$3" </dev/null
    ;;
health-check)
    # health-check PROGRAM CHAIN [PYTHON]: install Slurm's HealthCheckProgram at PROGRAM:
    # with PYTHON (a GPU node) the GPU check, which runs CHAIN (the site's, e.g. NHC)
    # first; else CHAIN alone, or nothing to check
    program=$1; chain=$2; python=${3:-}
    if [ -n "$python" ]; then
        run="exec $python /etc/slurm-burst/gpucheck.py health"
    elif [ -n "$chain" ]; then
        run="exec $chain"
    else
        run="exit 0"
    fi
    install -d -m 0755 "$(dirname "$program")"
    printf '#!/bin/sh\n# slurm-burst: HealthCheckProgram of a burst node\n%s\n' "$run" > "$program.tmp"
    chmod 0755 "$program.tmp"
    mv -f "$program.tmp" "$program"
    ;;
agent-start)
    # agent-start PYTHON ARGS...: the node agent (direct tunnels to the node's cloud peers,
    # /run/slurm-burst-agent.py, put there by the daemon), started once and detached; its
    # log is /var/log/slurm-burst-agent.log.
    py=$1; shift
    pid=/run/slurm-burst-agent.pid
    if [ -s "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null; then exit 0; fi
    setsid "$py" /run/slurm-burst-agent.py "$@" </dev/null >>/var/log/slurm-burst-agent.log 2>&1 &
    echo $! > "$pid"
    ;;
slurmd-start)
    # slurmd-start NODE CONF_SERVER [SLURMD_ARGS...]: start slurmd (once) in configless
    # mode as NODE; on 23.11+ the instance's --instance-id, --instance-type and --extra;
    # a dynamic group's node: -Z and --conf (its settings: it is in no slurm.conf line)
    node=$1; server=$2; shift 2
    install -d -m 0755 /var/log/slurm /var/lib/slurm /run/slurm
    if pgrep -x slurmd >/dev/null 2>&1; then
        echo "slurmd already running"
    else
        if ! slurmd --conf-server "$server" -N "$node" "$@" </dev/null >>/var/log/slurm/slurmd-start.log 2>&1
        then
            tail -n 5 /var/log/slurm/slurmd-start.log "/var/log/slurm/slurmd-$node.log" >&2 || true
            exit 1
        fi
    fi
    ;;
diagnose)
    # diagnose NODE: what an admin would look at when slurmd never registered
    node=$1
    echo "slurmd: $(pgrep -x slurmd >/dev/null 2>&1 && echo running || echo 'not running')"
    tail -n 15 /var/log/slurm/slurmd-start.log "/var/log/slurm/slurmd-$node.log" 2>&1 || true
    ;;
*)
    echo "unknown step: $step" >&2
    exit 2
    ;;
esac
