#!/usr/bin/env bash
# Install the Debian packages slurm-burst and its lab need. Idempotent: installs only
# what is missing, so a second run takes a fraction of a second.
set -euo pipefail

PACKAGES=(
  slurm-wlm slurm-client slurmdbd munge      # Slurm 22.05 (bookworm) and munge
  wireguard-tools wireguard-go                # the mesh (no kernel module here)
  openssh-server openssh-client               # sshd inside each namespace VM
  iproute2 util-linux procps                  # ip, nsenter/unshare/mount, pgrep
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
