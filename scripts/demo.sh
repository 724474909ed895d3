#!/usr/bin/env bash
# `make demo`: the burst path in the lab, start to finish.
#   lab up (slurmctld, on-prem node, namespace cloud, slurm-burst daemon and hooks)
#   -> sbatch -p burst-cpu -N2 --wrap 'srun hostname'
#   -> Slurm calls our resume hook -> the daemon launches two VMs, bootstraps them over SSH,
#      joins them over WireGuard, starts configless slurmd -> the job runs on them.
set -euo pipefail
cd "$(dirname "$0")/.."
SB=(.venv/bin/slurm-burst --config slurm-conf/lab/slurm-burst.toml)
export SLURM_CONF=/var/lib/slurm-burst-lab/etc/slurm/slurm.conf
SHARED=/srv/slurm-burst-lab

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "bringing the lab up"
"${SB[@]}" lab up >/dev/null
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

say "ledger: one row per instance (closed when the node is released)"
"${SB[@]}" ledger instances

cat <<TXT

The nodes stay up until they have been idle for the partition's SuspendTime (30 s in the
lab); Slurm then calls slurm-burst-suspend and the daemon destroys the VMs, removes the hub
peers, releases the mesh addresses and closes the ledger rows. Watch it:
    ${SB[*]} events --follow
    ${SB[*]} ledger instances
Try more:   export SLURM_CONF=$SLURM_CONF
            sbatch -p burst-gpu --gres=gpu:1 --wrap 'hostname; echo \$SLURM_GPUS_ON_NODE'
Tear the whole lab down (VMs, daemon, hub, slurmctld, files):   make lab-down
TXT
