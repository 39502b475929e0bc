#!/usr/bin/env bash
# Install what the tests and benchmarks use (idempotent): cargo-fuzz (a
# cargo tool, for scripts/fuzz.sh) and Debian packages.
set -euo pipefail
CARGO_FUZZ_VERSION=0.13.2
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
  echo "install-deps: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
# g++: libfuzzer-sys compiles libFuzzer (C++) for the fuzz targets.
PKGS=(sip-tester sipsak tshark tcpdump iperf3 iptables kamailio iproute2 prometheus dnsmasq-base
      redis-server redis-tools
      gstreamer1.0-tools gstreamer1.0-plugins-good gstreamer1.0-plugins-base
      xdp-tools libxdp-dev clang g++
      jacktrip jackd2 sox bc python3 ethtool stunnel4 openssl iputils-ping kamailio-tls-modules
      kamailio-websocket-modules
      baresip-core systemd chromium)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm (sip_proxy_browser.rs installs JsSIP with npm): Debian's
# nodejs and npm, unless a node that brings its own npm is there already.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
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
