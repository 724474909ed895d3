#!/usr/bin/env bash
# `make demo`: the burst path in the lab, start to finish.
#   lab up (slurmctld, on-prem node, namespace cloud, slurm-burst daemon and hooks)
#   -> sbatch -p burst-cpu -N2 --wrap 'srun hostname'
#   -> Slurm calls our resume hook -> the daemon launches two VMs, bootstraps them over SSH,
#      joins them over WireGuard, starts configless slurmd -> the job runs on them.
set -euo pipefail
cd "$(dirname "$0")/.."
SB=(.venv/bin/slurm-burst --config slurm-conf/lab/slurm-burst.toml)
PY=.venv/bin/python
# the Slurm release to run: the host's (22.05) unless LAB_SLURM names 24.11 or 26.05
LAB_SLURM=${LAB_SLURM:-22.05}
export SLURM_CONF=/var/lib/slurm-burst-lab/etc/slurm/slurm.conf
export PATH=/var/lib/slurm-burst-lab/slurm/bin:$PATH   # the commands of that release
SHARED=/srv/slurm-burst-lab
# the lab's own settings are its plugin's [lab] section (slurm_burst_lab.config)
PROM=$("$PY" -c 'import pathlib, sys
from slurm_burst.config import load_config
from slurm_burst_lab.config import settings
print(settings(load_config(pathlib.Path(sys.argv[1]))).prometheus)' slurm-conf/lab/slurm-burst.toml)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "bringing the lab up (Slurm $LAB_SLURM)"
"${SB[@]}" lab up --slurm "$LAB_SLURM" >/dev/null
sinfo

say "sbatch -p burst-cpu -N2 --wrap 'srun hostname'"
job=$(sbatch --parsable -p burst-cpu -N2 -t 5 -D "$SHARED" -o "$SHARED/%j.out" --wrap 'srun hostname')
echo "submitted job $job; Slurm resumes two cloud nodes through slurm-burst-resume"
start=$(date +%s)
state=PENDING
while :; do
    state=$(scontrol show job -o "$job" | tr ' ' '\n' | sed -n 's/^JobState=//p')
    case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL) break ;; esac
    printf '  %3ss  job %s  %s   nodes: %s\n' "$(( $(date +%s) - start ))" "$job" "$state" \
        "$(sinfo -h -p burst-cpu -t 'powering_up,idle,alloc,mix,completing' -o '%T:%N' | paste -sd' ')"
    if (( $(date +%s) - start > 240 )); then echo "timed out"; exit 1; fi
    sleep 2
done
echo "job $job: $state after $(( $(date +%s) - start )) s"

say "job output ($SHARED/$job.out): the two cloud VMs' hostnames"
cat "$SHARED/$job.out"

say "slurm-burst nodes"
"${SB[@]}" nodes

say "Slurm's view: NodeAddr is each node's WireGuard mesh address"
scontrol show node -o "$(scontrol show job -o "$job" | tr ' ' '\n' | sed -n 's/^NodeList=//p')" \
    | tr ' ' '\n' | grep -E '^(NodeName|NodeAddr|State)='

say "WireGuard hub"
wg show wg-burst | grep -E 'peer|allowed ips|latest handshake'

say "waiting for the nodes to be released (idle for SuspendTime, 30 s in the lab)"
start=$(date +%s)
until "${SB[@]}" ledger sync --json >/dev/null 2>&1 && \
      [ "$("${SB[@]}" ledger report --by job --format json --from 2000-01-01 --to 2100-01-01 \
            | "$PY" -c 'import json,sys; print(any(r["job"] == sys.argv[1] for r in json.load(sys.stdin)["rows"]))' "$job")" = True ]; do
    printf '  %3ss  %s\n' "$(( $(date +%s) - start ))" \
        "$("${SB[@]}" nodes --json | "$PY" -c 'import json,sys; print(" ".join(n["name"] + ":" + n["state"] for n in json.load(sys.stdin)["nodes"]))')"
    if (( $(date +%s) - start > 180 )); then echo "not released in 180 s"; exit 1; fi
    sleep 5
done

say "ledger: one row per instance (price, the rate it came from, cost)"
"${SB[@]}" ledger instances

say "chargeback: job $job's cost, overhead (boot, idle before suspend) included"
"${SB[@]}" ledger report --by job --from 2000-01-01 --to 2100-01-01
"${SB[@]}" ledger report --by account --from 2000-01-01 --to 2100-01-01

cat <<TXT

The daemon destroyed the VMs, removed the hub peers, released the mesh addresses, read the
job from slurmdbd (sacct) and split each instance's cost among its jobs. Watch a release:
    ${SB[*]} events --follow
Budgets (Slurm enforces them):  ${SB[*]} budget set physics 0; ${SB[*]} budget show
Prometheus (scrapes the daemon; the shipped alert rules):  http://$PROM/graph
    its alerts page:  http://$PROM/alerts   (docs/observability.md: each alert's runbook)
    e.g.  curl -s 'http://$PROM/api/v1/query?query=slurm_burst_nodes'
    the Grafana dashboard for it:  slurm-conf/grafana/slurm-burst.json
Try more:   export SLURM_CONF=$SLURM_CONF PATH=/var/lib/slurm-burst-lab/slurm/bin:\$PATH
            sbatch -p burst-gpu --gres=gpu:1 --wrap 'hostname; echo \$SLURM_GPUS_ON_NODE'
                # its node passes the GPU check (NVML, simulated here) before it joins; then
            curl -s 127.0.0.1:9466/metrics | grep '^slurm_burst_gpu'   # its GPUs' use
            srun -p burst-ec2 -N2 hostname   # EC2: our EC2 profile on the lab's EC2 emulator
Another Slurm release:   LAB_SLURM=24.11 make demo   (or 26.05; its image is built once)
Tear the whole lab down (VMs, daemon, hub, slurmctld, files):   make lab-down
TXT
