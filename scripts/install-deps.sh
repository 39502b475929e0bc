#!/usr/bin/env bash
# Install the Debian packages the tests and benchmarks use (idempotent).
set -euo pipefail
PKGS=(sip-tester sipsak tshark tcpdump iperf3 iptables kamailio iproute2 prometheus
      redis-server redis-tools
      gstreamer1.0-tools gstreamer1.0-plugins-good gstreamer1.0-plugins-base
      xdp-tools libxdp-dev clang
      jacktrip jackd2 sox bc python3)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}; run as root (apt-get install)" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
