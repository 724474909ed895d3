#!/usr/bin/env bash
# `make demo-training`: a distributed training run on burst nodes that survives a reclaim.
#   lab up -> a dataset on-prem, and the loss one process reaches on it (the reference)
#   -> one sbatch as its users write it: 4 EC2 Spot nodes (falling back to on-demand),
#      #BB_LUA stage_in of the dataset, stage_out of the checkpoints (synced while it runs),
#      --signal=USR1 to checkpoint on, MPI ranks over the nodes' direct WireGuard tunnels
#   -> mid-run the lab's EC2 emulator sends a Spot interruption notice to rank 0's node
#   -> the ranks checkpoint, the daemon syncs it home and requeues the job, the job resumes
#      on new nodes from that checkpoint and ends with the reference's loss, bit for bit
#   -> the final model comes home verified; the ledger shows both lives and the cost.
# STEPS (default 120) and STEP_TIME (0.25 s) size the run; RECLAIM_AT (step 30) is when
# the notice comes; LAB_SLURM picks the Slurm release as for `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
SB=(.venv/bin/slurm-burst --config slurm-conf/lab/slurm-burst.toml)
PY=.venv/bin/python
LAB_SLURM=${LAB_SLURM:-22.05}
STEPS=${STEPS:-120}
STEP_TIME=${STEP_TIME:-0.25}
RECLAIM_AT=${RECLAIM_AT:-30}
export SLURM_CONF=/var/lib/slurm-burst-lab/etc/slurm/slurm.conf
export PATH=/var/lib/slurm-burst-lab/slurm/bin:$PATH
STATE=/var/lib/slurm-burst-lab
WORK=/srv/slurm-burst-lab/training   # the programs and the job's output: the VMs see it
DATA=$STATE/data/training            # the dataset: on-prem, no cloud VM sees it
HOMEDIR=$STATE/results/training      # where the checkpoints come home
NODE_PY=/usr/bin/python3             # Debian's, with python3-mpi4py and python3-numpy
# the lab's settings, from its config: the EC2 emulator's port, the mesh's subnet, the
# jobs' user, and whether the release under test is the host's own
read -r EC2_PORT SUBNET JOB_USER HOST_RELEASE < <("$PY" -c 'import pathlib, sys
from slurm_burst.config import load_config
from slurm_burst_lab.accounting import JOB_USER
from slurm_burst_lab.images import HOST_RELEASE
cfg = load_config(pathlib.Path(sys.argv[1]))
print(cfg.providers["aws"].options["port"], cfg.mesh.subnet, JOB_USER, HOST_RELEASE)' \
    slurm-conf/lab/slurm-burst.toml)
EMU=http://127.0.0.1:$EC2_PORT/_emulator

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
field() { scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
json() { "$PY" -c "import json, sys; d = json.load(sys.stdin); $1"; }
# the job's training lines so far
said() { cat "$WORK/$job.out" 2>/dev/null || true; }
state_is() { [ "$(field "$job" JobState)" = "$1" ]; }
requeued() { [ "$(field "$job" Restarts)" -ge 1 ]; }
ended() { [[ "$(field "$job" JobState)" =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$ ]]; }
waitfor() {  # waitfor SECONDS WHAT COMMAND...: until COMMAND succeeds, a line every 3 s
    local limit=$1 what=$2 t0; t0=$(date +%s); shift 2
    until "$@"; do
        local t=$(( $(date +%s) - t0 ))
        (( t > limit )) && { echo "no $what after $limit s"; said | tail -20; exit 1; }
        (( t % 3 == 0 )) && printf '  %3ss  job %s %s  %s\n' "$t" "$job" "$(field "$job" JobState)" \
            "$(said | grep -E '^(step|resumed|signalled)' | tail -1)"
        sleep 1
    done
}

say "bringing the lab up (Slurm $LAB_SLURM)"
"${SB[@]}" lab up --slurm "$LAB_SLURM" >/dev/null
sinfo -p burst-train

say "the dataset, on-prem ($DATA), and the loss one process reaches on it"
mkdir -p "$WORK" "$DATA" "$HOMEDIR"
chmod 1777 "$WORK" "$HOMEDIR"
cp examples/training/train.py examples/training/allreduce.py "$WORK/"
chmod 0644 "$WORK"/*.py
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_MCA_btl=self "$NODE_PY" "$WORK/train.py" --data "$DATA/train-data.npz" \
    --make-data 4096,32,7 --steps "$STEPS" >"$WORK/reference.out"
chmod 0755 "$DATA" && chmod 0644 "$DATA/train-data.npz"
want=$(sed -n 's/^final loss //p' "$WORK/reference.out")
echo "train-data.npz: $(stat -c %s "$DATA/train-data.npz") bytes, sha256 $(sha256sum "$DATA/train-data.npz" | cut -c1-16)..."
echo "one process, $STEPS steps: final loss $want"

# each node waits for its direct tunnels to the three others before the ranks start
# each node waits for its direct tunnels to the three others: their routes, then a TCP
# connection through each to the peer's slurmd (a tunnel carries nothing before its
# handshake; no ping: a minimal image has none, and the job is no root)
cat >"$WORK/tunnels.sh" <<'SH'
#!/bin/bash
for _ in $(seq 240); do
    peers=$(ip -o route show dev wg-burst-d | cut -d' ' -f1)
    ok=$(( $(echo $peers | wc -w) >= 3 ))
    for p in $peers; do timeout 2 bash -c ": </dev/tcp/$p/6818" 2>/dev/null || ok=0; done
    [ "$ok" = 1 ] && exit 0
    sleep 0.5
done
echo "$(hostname): no direct tunnels to the other nodes" >&2; exit 3
SH
# 22.05 and 24.11 ship Slurm's PMIx plugin: srun starts the ranks, and --signal=USR1
# (no B:) signals every task of the job's steps, the ranks. 26.05's packages ship pmi2
# only: mpirun inside the allocation (it starts its daemons with srun); the ranks are
# not a step's tasks then, so the batch shell takes the signal (B:) and hands it to
# mpirun, which passes SIGUSR1 on to every rank.
train="$NODE_PY $WORK/train.py --data \"\$SLURM_BURST_STAGE_DATA/train-data.npz\" \\
    --checkpoint \"\$SLURM_BURST_STAGE_CKPT\" --steps $STEPS --every 20 --step-time $STEP_TIME"
if [ "$LAB_SLURM" = 26.05 ]; then
    signal="B:USR1@120"
    run_ranks="trap 'kill -USR1 \$ranks 2>/dev/null' USR1
mpirun --bind-to none --map-by ppr:1:node $train &
ranks=\$!
until wait \$ranks; rc=\$?; ! kill -0 \$ranks 2>/dev/null; do :; done  # a trap ends a wait
exit \$rc"
else
    signal="USR1@120"
    run_ranks="srun --mpi=pmix $train"
fi
cat >"$WORK/train.sbatch" <<SH
#!/bin/bash
#SBATCH -p burst-train -N4 --ntasks-per-node=1 -t 20 --requeue --open-mode=append
#SBATCH --signal=$signal
#BB_LUA stage_in src=$DATA dst=data
#BB_LUA stage_out src=ckpt dst=$HOMEDIR/%j sync=60
# OpenMPI over the mesh: the nodes' other interfaces reach nothing of each other's; peers
# by subnet (Open MPI 5's netlink check refuses a peer routed through wg-burst-d)
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=$SUBNET OMPI_MCA_oob_tcp_if_include=$SUBNET
export OMPI_MCA_reachable=weighted
export OMPI_MCA_opal_signal= PYTHONFAULTHANDLER=1  # a crash prints Python's stack
echo "run \$((\${SLURM_RESTART_COUNT:-0} + 1)) on \$SLURM_JOB_NODELIST at \$(date +%s)"
srun bash $WORK/tunnels.sh || exit 3
$run_ranks
SH
chmod 0644 "$WORK/train.sbatch" "$WORK/tunnels.sh"

say "sbatch $WORK/train.sbatch (as $JOB_USER)"
grep -E '^#(SBATCH|BB_LUA)|train.py|^trap' "$WORK/train.sbatch"
as_user=(runuser -u "$JOB_USER" --)
if [ "$LAB_SLURM" != "$HOST_RELEASE" ]; then  # another release's sbatch chroots first, as root
    as_user=(env "SBLAB_AS_UID=$(id -u "$JOB_USER"):$(id -g "$JOB_USER")")
fi
job=$("${as_user[@]}" sbatch --parsable -A physics -D "$WORK" -o "$WORK/%j.out" "$WORK/train.sbatch")
echo "submitted job $job: the dataset goes to the lab's S3 store, Slurm resumes 4 Spot nodes"
submitted=$(date +%s)
waitfor 300 "job running" state_is RUNNING
echo "job $job running on $(field "$job" NodeList) after $(( $(date +%s) - submitted )) s"

say "where the data went"
"${SB[@]}" stage jobs --json | json "
for s in d['stages']:
    if s['job_id'] == $job:
        for x in s['datasets']:
            print(f\"{x.get('src')}: {x.get('files')} files, {x.get('bytes')} bytes \"
                  f\"({x.get('bytes_sent')} new to the store), pulled by each node\")"
nodes_now() {  # the job's nodes as they are now: instance, size, market
    "${SB[@]}" nodes --json | json "
for n in d['nodes']:
    if n['name'].startswith('burst-train-') and n['state'] == 'joined':
        print(f\"{n['name']}: {n['instance_id']} {n.get('size', '')} {n.get('market') or 'on-demand'}\")"
}
nodes_now

say "training: a checkpoint every 20 steps, synced to the store every 60 s and on a notice"
waitfor 120 "step $RECLAIM_AT" sh -c "grep -q '^step $RECLAIM_AT ' '$WORK/$job.out'"
said | grep -E '^(checkpoint|step [0-9]*[05] )' | tail -4
"${SB[@]}" stage outputs --job "$job"

first=$(scontrol show hostnames "$(field "$job" NodeList)" | head -1)
instance=$("${SB[@]}" nodes --json | json "print(next(n['instance_id'] for n in d['nodes'] if n['name'] == '$first'))")
say "EC2 reclaims $first (rank 0, $instance): a Spot interruption notice, 30 s ahead"
noticed=$(date +%s.%N)
curl -sf "$EMU/interrupt?instance=$instance&in=30" >/dev/null
waitfor 60 "checkpoint on the signal" sh -c "grep -q '^signalled' '$WORK/$job.out'"
said | grep '^signalled'
waitfor 120 "requeue" requeued
"${SB[@]}" events --json | "$PY" -c 'import json, sys, time
since = float(sys.argv[1]) - 5
for line in sys.stdin:
    e = json.loads(line)
    if e["at"] >= since and e["event"] in ("spot.interruption", "job.signalled", "job.requeued",
                                          "output.synced_on_notice", "node.failed",
                                          "size.unavailable", "node.spot_fallback"):
        at = time.strftime("%H:%M:%S", time.localtime(e["at"]))
        what, node, detail = e["event"], e["node"], e["detail"][:70]
        print(f"{at}  {what:18} {node:14} {detail}")' "$noticed"

say "the job again, from its last checkpoint"
waitfor 300 "second run" sh -c "grep -q '^resumed at step' '$WORK/$job.out'"
again=$(date +%s.%N)
said | grep -E '^(run [0-9]|resumed)'
nodes_now
waitfor 300 "the end of the job" ended
state=$(field "$job" JobState)
got=$(sed -n 's/^final loss //p' "$WORK/$job.out")
echo "job $job: $state after $(( $(date +%s) - submitted )) s, $(field "$job" Restarts) requeue(s)"
echo "final loss:     $got"
echo "one process:    $want"
[ "$state" = COMPLETED ] && [ "$got" = "$want" ] || { echo "the run did not end as one process does"; exit 1; }
printf 'from the notice to training again: %.0f s\n' "$(echo "$again - $noticed" | bc)"

say "the final model comes home verified ($HOMEDIR/$job)"
sealed() { "${SB[@]}" stage outputs --job "$job" --json | grep -q '"sealed"'; }
waitfor 180 "outputs home" sealed
"${SB[@]}" stage outputs --job "$job"
sha256sum "$HOMEDIR/$job/checkpoint.npz"
"$NODE_PY" -c 'import json, sys, numpy as np
with np.load(sys.argv[1]) as z:
    meta = json.loads(bytes(z["meta"]).decode())
step, loss = meta["step"], meta["losses"][-1]
print(f"the model: step {step}, loss {loss} (the job\x27s last)")' "$HOMEDIR/$job/checkpoint.npz"

say "the ledger: the job's two lives, their instances, its transfers and its cost"
echo "(waiting for the nodes' release: idle for SuspendTime, 30 s in the lab)"
# the ledger's rows of this run: the job's lives (sacct's records) and every burst-train
# instance launched since the sbatch; done once each life is in and every instance ended
ledger() {
    "${SB[@]}" ledger sync --json >/dev/null 2>&1 || return 1
    "$PY" - "$job" "$submitted" "$1" <<'PYTHON'
import datetime, json, subprocess, sys
job, since, show = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "show"
sb = [".venv/bin/slurm-burst", "--config", "slurm-conf/lab/slurm-burst.toml", "ledger"]
def read(*args):
    return json.loads(subprocess.run(sb + list(args), capture_output=True, text=True,
                                     check=True).stdout)
def at(text):
    t = datetime.datetime.fromisoformat(text)
    return (t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)).timestamp()
lives = [r for r in read("report", "--by", "job", "--json", "--from", "2000-01-01",
                         "--to", "2100-01-01")["rows"] if r["job"] == job]
mine = [r for r in read("instances", "--json")
        if r["node"].startswith("burst-train-") and at(r["requested"]) >= since]
if not show:  # both lives (sacct's requeued record and the last), every instance ended
    states = {r["state"] for r in lives}
    done = "COMPLETED" in states and len(states) > 1 and all(r["terminated"] for r in mine)
    sys.exit(0 if done else 1)
for r in sorted(mine, key=lambda r: r["requested"]):
    print(f"{r['node']:14} {r['instance_id']:20} {r['size']:9} {r['hours']:.4f} h  "
          f"${r['cost']:.6f}  {r['failure_code'] or ''}")
total = 0.0
for r in sorted(lives, key=lambda r: r["start"]):
    total += r["total"]
    print(f"job {job} {r['state']:9} {r['start'][11:19]}-{r['end'][11:19]}  "
          f"{r['instance_hours']:.4f} instance-h  ${r['total']:.6f} (overhead "
          f"${r['overhead']:.6f}, staging ${r['staging']:.6f})")
print(f"job {job}: ${total:.6f} in all, charged to account {lives[0]['account']}")
PYTHON
}
waitfor 240 "the job's lives in the ledger" ledger check
ledger show
"${SB[@]}" ledger transfers --job "$job"

cat <<TXT

The job's script: $WORK/train.sbatch; its output: $WORK/$job.out.
The model: $HOMEDIR/$job/checkpoint.npz (verified against the store's SHA-256 on its way home).
Watch the daemon:   ${SB[*]} events --follow
Tear the lab down:  make lab-down
TXT
