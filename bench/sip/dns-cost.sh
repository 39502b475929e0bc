#!/usr/bin/env bash
# Cost of an RFC 3263 next-hop lookup (issue 22): `ringway sip resolve`
# against Debian's dnsmasq serving NAPTR -> SRV (two targets) -> A for
# sip.test, with a cold cache (emptied before every lookup: NAPTR, SRV and
# two A questions to the nameserver) and a warm one (every question from the
# cache), side by side in one run, REPEAT times each, alternating, so the
# spread between runs is the noise floor. The dispatcher resolves its
# proxies at start and then from the cache once a second (0 per call).
#
# Part 2, the proxy's name next hops: `ringway sip proxy --mode stateful`
# between a SIPp UAC and UAS, CALLS calls at RATE/s, with `--route-to` an IP
# literal (127.0.0.30:5070), a name with a warm cache (uas.warm.test:5070,
# TTL 300: every call answered from the cache on the worker) and a name with
# a cold cache (uas.cold.test:5070, TTL 0: every call parked and looked up on
# a resolver thread), alternated REPEAT times; process CPU (user+sys, the
# resolver threads included) per call and what it adds over the IP literal.
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`): dnsmasq on 127.0.0.53:53, no DNS
# leaves it. Every process is started by this script and stopped by PID.
# Not a test: timings (run on a quiet machine; `uptime` is printed).
#
# Usage: bench/sip/dns-cost.sh
#   env: RINGWAY=path (default target/release/ringway)  LOOKUPS=2000
#        REPEAT=3  CPU=0 (taskset for ringway; empty: no pinning)
#        CALLS=2000 RATE=400 (part 2; CALLS=0 skips it)
#        OUT=/tmp/ringway-dns-cost
# Columns: cache, run, lookups, mean us, median us, p99 us, DNS queries
# sent per lookup; part 2: hop, run, calls ok/failed, CPU us per call,
# requests parked, us per call over the IP literal of the same run.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
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
host-record=uas.warm.test,127.0.0.30
host-record=uas.cold.test,127.0.0.30,0
CONF
dnsmasq --keep-in-foreground --conf-file="$OUT/dnsmasq.conf" --pid-file= --user=root \
    --log-facility="$OUT/dnsmasq.log" &
DNSMASQ=$!
PIDS=("$DNSMASQ")
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

CALLS="${CALLS:-2000}"
RATE="${RATE:-400}"
[[ "$CALLS" == 0 ]] && exit 0
command -v sipp >/dev/null || { echo "dns-cost: sipp missing (scripts/install-deps.sh): part 2 skipped" >&2; exit 0; }
sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.30 -p 5070 -nostdin >"$OUT/uas.log" 2>&1 &
PIDS+=("$!")
echo
printf '%-5s %3s %7s %6s %10s %7s %12s\n' hop run ok failed cpu_us/call parked over_ip_us
for run in $(seq "$REPEAT"); do
    ip_us=""
    for hop in ip warm cold; do
        case "$hop" in
            ip) to=127.0.0.30:5070 ;;
            warm) to=uas.warm.test:5070 ;;
            cold) to=uas.cold.test:5070 ;;
        esac
        json="$OUT/proxy-$hop-$run.json"
        rm -f "$json"
        "${PIN[@]}" "$RINGWAY" sip proxy --listen 127.0.0.10:5060 --mode stateful \
            --route-to "$to" --dns-server 127.0.0.53:53 --relay 127.0.0.0/8 \
            --duration 3600 --quiet --summary "$json" 2>"$OUT/proxy-$hop-$run.log" &
        proxy=$!
        PIDS+=("$proxy")
        for _ in $(seq 100); do
            ss -lun | grep -q '127.0.0.10:5060' && break
            sleep 0.05
        done
        csv="$OUT/uac-$hop-$run.csv"
        rm -f "$csv"
        sipp 127.0.0.10:5060 -sf "$HERE/uac_rr.xml" -s bob -key dest example.com \
            -i 127.0.0.40 -p 5061 -m "$CALLS" -r "$RATE" -d 0 -timeout 120 -timeout_error \
            -nostdin -trace_stat -fd 1 -stf "$csv" >/dev/null 2>&1 || true
        kill -INT "$proxy"
        wait "$proxy" || true
        line=$(python3 - "$json" "$csv" "$hop" "$run" "${ip_us:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rows = [l.split(";") for l in open(sys.argv[2]) if l.strip()]
head, last = rows[0], rows[-1]
get = lambda k: int(last[head.index(k)])
ok, failed = get("SuccessfulCall(C)"), get("FailedCall(C)")
cpu = s["cpu"]["process"]
us = (cpu["user_s"] + cpu["sys_s"]) * 1e6 / max(ok + failed, 1)
over = "" if sys.argv[3] == "ip" or not sys.argv[5] else "%+.1f" % (us - float(sys.argv[5]))
print("%-5s %3s %7d %6d %10.1f %7d %12s %.3f" % (sys.argv[3], sys.argv[4], ok, failed, us,
      s["proxy"].get("names_parked", 0), over, us))
PY
)
        echo "${line% *}"
        [[ "$hop" == ip ]] && ip_us="${line##* }"
    done
done
