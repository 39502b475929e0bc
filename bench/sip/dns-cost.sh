#!/usr/bin/env bash
# Cost of an RFC 3263 next-hop lookup (issue 22): `ringway sip resolve`
# against Debian's dnsmasq serving NAPTR -> SRV (two targets) -> A for
# sip.test, with a cold cache (emptied before every lookup: NAPTR, SRV and
# two A questions to the nameserver) and a warm one (every question from the
# cache), side by side in one run, REPEAT times each, alternating, so the
# spread between runs is the noise floor. A proxy that had to resolve once
# per call would pay this per call; the dispatcher resolves its proxies once
# at start (0 per call).
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`): dnsmasq on 127.0.0.53:53, no DNS
# leaves it. Every process is started by this script and stopped by PID.
# Not a test: timings (run on a quiet machine; `uptime` is printed).
#
# Usage: bench/sip/dns-cost.sh
#   env: RINGWAY=path (default target/release/ringway)  LOOKUPS=2000
#        REPEAT=3  CPU=0 (taskset for ringway; empty: no pinning)
#        OUT=/tmp/ringway-dns-cost
# Columns: cache, run, lookups, mean us, median us, p99 us, DNS queries
# sent per lookup.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
if [[ "${RINGWAY_BENCH_NETNS:-}" != "1" ]]; then
    exec env RINGWAY_BENCH_NETNS=1 unshare -n -- bash "$0" "$@"
fi
ip link set lo up
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
LOOKUPS="${LOOKUPS:-2000}"
REPEAT="${REPEAT:-3}"
CPU="${CPU-0}"
OUT="${OUT:-/tmp/ringway-dns-cost}"
mkdir -p "$OUT"
command -v dnsmasq >/dev/null || { echo "dns-cost: dnsmasq missing (scripts/install-deps.sh)" >&2; exit 1; }
cat >"$OUT/dnsmasq.conf" <<'CONF'
listen-address=127.0.0.53
bind-interfaces
port=53
no-resolv
no-hosts
no-poll
local=/test/
local-ttl=300
naptr-record=sip.test,10,10,"S","SIP+D2U","",_sip._udp.sip.test
srv-host=_sip._udp.sip.test,a.sip.test,5060,10,1
srv-host=_sip._udp.sip.test,b.sip.test,5060,20,1
host-record=a.sip.test,127.0.0.21
host-record=b.sip.test,127.0.0.22
CONF
dnsmasq --keep-in-foreground --conf-file="$OUT/dnsmasq.conf" --pid-file= --user=root \
    --log-facility="$OUT/dnsmasq.log" &
DNSMASQ=$!
trap 'kill "$DNSMASQ" 2>/dev/null || true; wait "$DNSMASQ" 2>/dev/null || true' EXIT
PIN=()
[[ -n "$CPU" ]] && PIN=(taskset -c "$CPU")
for _ in $(seq 50); do
    "$RINGWAY" sip resolve sip.test --dns-server 127.0.0.53:53 >/dev/null 2>&1 && break
    sleep 0.1
done
echo "# $(uptime)"
printf '%-5s %3s %7s %9s %9s %9s %12s\n' cache run lookups mean_us median_us p99_us queries/lkp
for run in $(seq "$REPEAT"); do
    for cache in cold warm; do
        flag=()
        [[ "$cache" == cold ]] && flag=(--cold)
        json="$OUT/$cache-$run.json"
        "${PIN[@]}" "$RINGWAY" sip resolve sip.test --dns-server 127.0.0.53:53 \
            --repeat "$LOOKUPS" "${flag[@]}" >"$json"
        python3 - "$json" "$cache" "$run" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
q = d["dns"]["queries"] / (d["lookups_timed"] + 1)
print("%-5s %3s %7d %9.1f %9.1f %9.1f %12.2f" % (sys.argv[2], sys.argv[3], d["lookups_timed"],
      d["mean_us"], d["median_us"], d["p99_us"], q))
PY
    done
done
