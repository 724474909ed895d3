#!/usr/bin/env bash
# Install the Debian packages slurm-burst and its lab need. Idempotent: installs only
# what is missing, so a second run takes a fraction of a second.
set -euo pipefail

PACKAGES=(
  slurm-wlm slurm-client slurmdbd munge      # Slurm 22.05 (bookworm) and munge
  wireguard-tools wireguard-go                # the mesh (no kernel module here)
  openssh-server openssh-client               # sshd inside each namespace VM
  iproute2 util-linux procps                  # ip, nsenter/unshare/mount, pgrep
  mariadb-server mariadb-client               # the lab's slurmdbd keeps accounting here
  mmdebstrap                                  # root filesystems of other Slurm releases (trixie, sid)
  lua5.1 lua-posix                            # burst_buffer.lua runs data_in with lua-posix; tests run it in lua5.1
  gcc libc6-dev                               # the lab's simulated NVML (libnvidia-ml.so.1)
  prometheus prometheus-alertmanager          # the lab's Prometheus; promtool and amtool check the shipped rules
  openmpi-bin python3-mpi4py python3-numpy    # the training job across burst nodes (examples/training)
  libpmix-dev                                 # srun --mpi=pmix: Slurm's plugin opens pmix2/lib/libpmix.so
  podman runc busybox-static                  # container images by digest: the lab's image and its jobs
)

if [ "$(id -u)" -ne 0 ]; then
  echo "setup-system: needs root to install Debian packages" >&2
  exit 3
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
# `make venv` runs `python3 -m venv`: Debian's own python3 has it in python3-venv (a
# Python of one's own, pyenv's, has it already)
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-system: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The packages' own services are not ours to start: the lab runs its own daemons.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup-system: all ${#PACKAGES[@]} Debian packages present"
fi

# Azurite (npm), Microsoft's Azure Storage emulator: the Azure Blob store's tests.
# Node.js and npm come with the machine (NodeSource's nodejs bundles npm, and Debian's npm
# package conflicts with it): Debian's are installed only where there is no npm at all.
AZURITE_VERSION=3.35.0
if ! command -v npm >/dev/null; then
  echo "setup-system: installing nodejs npm"
  apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ "$(azurite-blob --version 2>/dev/null || true)" != "$AZURITE_VERSION" ]; then
  echo "setup-system: installing Azurite $AZURITE_VERSION (npm)"
  npm install -g --no-fund --no-audit --loglevel=error "azurite@$AZURITE_VERSION"
fi

# Database servers: MariaDB for the lab's slurmdbd, PostgreSQL for the ledger's tests
# (production ledgers live there). Started only if installed and not answering.
if ! mariadb -u root -e 'SELECT 1' >/dev/null 2>&1; then
  echo "setup-system: starting MariaDB"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 60); do mariadb -u root -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.5; done
fi
if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  if ! pg_isready -q -h 127.0.0.1 2>/dev/null; then
    echo "setup-system: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort | tail -1)" main start || true
  fi
fi

# Podman for the lab's container jobs, as this kind of machine allows it: runc (crun
# refuses the hybrid cgroup layout here) with cgroupfs, no journal for events, limits
# within this machine's hard ones (podman's default nofile/nproc exceed them), and vfs
# storage (each lab VM keeps its own on a tmpfs). Written once; a site's files are kept.
if [ -d /etc/containers ] && [ ! -e /etc/containers/containers.conf.d/50-slurm-burst-lab.conf ]; then
  mkdir -p /etc/containers/containers.conf.d
  cat > /etc/containers/containers.conf.d/50-slurm-burst-lab.conf <<'CONF'
# slurm-burst lab (scripts/setup-system.sh)
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
CONF
fi
if [ -d /etc/containers ] && [ ! -e /etc/containers/storage.conf ]; then
  cat > /etc/containers/storage.conf <<'CONF'
# slurm-burst lab (scripts/setup-system.sh): vfs works on any filesystem, tmpfs included
[storage]
driver = "vfs"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
CONF
fi
