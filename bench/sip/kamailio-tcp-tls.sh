#!/usr/bin/env bash
# SIP over TCP and TLS, ringway against Kamailio 5.6 (its tcp core and tls
# module) in one run (issue 21's benchmarks): calls/s at 0 failed and CPU
# per call, with 1 and 2 workers, and TLS handshakes per second. Both
# proxies are stateless (bench/kamailio/tcp-tls.cfg: forward() with
# record_route(); ringway --mode stateless). Not a test: timings (run on a
# quiet machine; `uptime` is printed first).
#
#   calls: SIPp UAC → proxy → SIPp UAS over TCP (`-t t1`, one connection
#          each way); over TLS SIPp (Debian's has no TLS) sits behind
#          stunnel on both sides: UAC → stunnel (6060) → TLS → proxy
#          (5061) → TLS → stunnel (5071) → UAS (5070). At each rate the two
#          proxies run one after the other, the order alternating from rate
#          to rate; the capacity is the highest rate with 0 failed (and
#          lost) calls where SIPp created the calls at >= 90 % of the rate.
#          CPU per call = utime+stime of the proxy's processes over the
#          step / successful calls; gen_cpu_s is SIPp's and stunnel's, to
#          tell when the generator is the limit (then the step is flagged).
#   handshakes: `ringway sip idle` opens HANDSHAKES TLS connections
#          (PARALLEL at once, no ping) to each proxy: completed per second
#          (the client shares the machine) and the proxy's CPU per
#          handshake, whose inverse is handshakes/s per core.
#
# Everything runs in a private network namespace with only `lo` (the
# script re-executes itself under `unshare -n`); every process is started
# here and stopped by PID.
#
# Usage: bench/sip/kamailio-tcp-tls.sh [RATES...]  (default 500 1000 2000 3000 4000 6000)
#   env: RINGWAY=path (default target/release/ringway)  SECS=10  PAUSE_MS=0
#        TRANSPORTS="tcp tls"  WORKERS_LIST="1 2"  PROXIES="ringway kamailio"
#        HANDSHAKES=2000 (0: skip)  PARALLEL=32  KAM_SHM_MB=1024
#        OUT=/tmp/ringway-tcp-tls-bench (results.tsv, handshakes.tsv, logs)
set -Eeuo pipefail
trap 'rc=$?; echo "kamailio-tcp-tls.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
SECS="${SECS:-10}"
PAUSE_MS="${PAUSE_MS:-0}"
TRANSPORTS="${TRANSPORTS:-tcp tls}"
WORKERS_LIST="${WORKERS_LIST:-1 2}"
PROXIES="${PROXIES:-ringway kamailio}"
HANDSHAKES="${HANDSHAKES:-2000}"
PARALLEL="${PARALLEL:-32}"
KAM_SHM_MB="${KAM_SHM_MB:-1024}"
OUT="${OUT:-/tmp/ringway-tcp-tls-bench}"
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(500 1000 2000 3000 4000 6000)
TCK="$(getconf CLK_TCK)"
mkdir -p "$OUT"
# shellcheck source=lib-tcp-tls.sh
source "$HERE/lib-tcp-tls.sh"
[[ " $PROXIES " == *" kamailio "* ]] && need_kamailio_tls
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
make_cert
uptime | tee "$OUT/uptime.txt"

# The scenarios over TLS: SIPp speaks TCP to stunnel but writes a TLS Via,
# and the UAS's Contact names the TLS address stunnel gives it.
sed 's|SIP/2.0/\[transport\]|SIP/2.0/TLS|' "$HERE/uac_rr.xml" >"$OUT/uac_tls.xml"
sed 's|<sip:\[local_ip\]:\[local_port\];transport=\[transport\]>|<sip:127.0.0.1:5071;transport=tls>|' \
    "$HERE/uas_rr.xml" >"$OUT/uas_tls.xml"

spawn_stunnel() { # NAME BODY
    printf 'foreground = yes\npid =\ndebug = 3\noutput = %s/%s.log\n%s\n' "$OUT" "$1" "$2" >"$OUT/$1.conf"
    stunnel4 "$OUT/$1.conf" </dev/null >/dev/null 2>&1 &
    GEN_PIDS+=($!)
    PIDS+=($!)
}

printf "transport\tproxy\tworkers\trate_cps\tcalls\tok\tfailed\tgen_cps\tcpu_s\tcpu_us_per_call\tgen_cpu_s\tflag\n" \
    | tee "$OUT/results.tsv"

# One step: TRANSPORT PROXY WORKERS RATE.
step() {
    local t=$1 kind=$2 workers=$3 rate=$4
    local log="$OUT/$t-$kind-w$workers-$rate" calls=$((rate * SECS))
    rm -f "$log".*
    GEN_PIDS=()
    start_proxy "$kind" "$workers" "$log"
    local uas_sf="$HERE/uas_rr.xml" uac_sf="$HERE/uac_rr.xml" remote=127.0.0.1:5060
    local dest="127.0.0.1:5070;transport=tcp"
    if [[ "$t" == tls ]]; then
        uas_sf="$OUT/uas_tls.xml" uac_sf="$OUT/uac_tls.xml" remote=127.0.0.1:6060
        dest="127.0.0.1:5071;transport=tls"
        spawn_stunnel stunnel-uas "[uas]
accept = 127.0.0.1:5071
connect = 127.0.0.1:5070
cert = $OUT/cert.pem
key = $OUT/key.pem"
        spawn_stunnel stunnel-uac "[uac]
client = yes
accept = 127.0.0.1:6060
connect = 127.0.0.1:5061"
    fi
    sipp -sf "$uas_sf" -i 127.0.0.1 -p 5070 -t t1 -nostdin -max_socket 4096 \
        -trace_stat -stf "$log.uas.csv" -fd 1 >/dev/null 2>"$log.uas.err" &
    GEN_PIDS+=($!)
    PIDS+=($!)
    wait_tcp_port 5070
    [[ "$t" == tls ]] && { wait_tcp_port 5071; wait_tcp_port 6060; }
    sleep 0.5
    local c0 g0 c1 g1 p
    c0=$(cpu_ticks "$PROXY_PID")
    g0=0
    for p in "${GEN_PIDS[@]}"; do g0=$((g0 + $(cpu_ticks "$p"))); done
    sipp "$remote" -sf "$uac_sf" -s bob -key dest "$dest" -i 127.0.0.1 -p 5062 -t t1 \
        -m "$calls" -r "$rate" -rp 1000 -l $((rate * 4 + 100)) -d "$PAUSE_MS" \
        -timeout $((SECS * 3 + 30)) -nostdin -trace_stat -stf "$log.uac.csv" -fd 1 \
        >/dev/null 2>"$log.uac.err" &
    local uac=$!
    PIDS+=("$uac")
    # SIPp UAC's CPU: sampled until it exits (its own stat goes with it).
    local uac_ticks=0 v
    while kill -0 "$uac" 2>/dev/null; do
        v=$(cpu_ticks "$uac")
        [[ "$v" -gt "$uac_ticks" ]] && uac_ticks=$v
        sleep 0.2
    done
    wait "$uac" 2>/dev/null || true
    c1=$(cpu_ticks "$PROXY_PID")
    g1=0
    for p in "${GEN_PIDS[@]}"; do g1=$((g1 + $(cpu_ticks "$p"))); done
    stop_pid "$PROXY_PID"
    for p in "${GEN_PIDS[@]}"; do stop_pid "$p"; done
    PIDS=()
    local ok failed g
    ok=$(csv_field "$log.uac.csv" "SuccessfulCall(C)" 2>/dev/null || echo 0)
    failed=$(csv_field "$log.uac.csv" "FailedCall(C)" 2>/dev/null || echo 0)
    g=$(gen_secs "$log.uac.csv" "$calls" 2>/dev/null || true)
    awk -v t="$t" -v k="$kind" -v w="$workers" -v r="$rate" -v n="$calls" -v ok="${ok:-0}" \
        -v f="${failed:-0}" -v g="$g" -v c0="$c0" -v c1="$c1" -v tck="$TCK" \
        -v gen=$((g1 - g0 + uac_ticks)) 'BEGIN {
            cpu = (c1 - c0) / tck; per = ok > 0 ? sprintf("%.1f", cpu * 1e6 / ok) : "n/a";
            gnum = g > 0 ? n / g : 0; gcps = g > 0 ? sprintf("%.0f", gnum) : "-";
            flag = "";
            if (f > 0 || ok < n) flag = "failed";
            else if (gnum < 0.9 * r) flag = "generator-behind";
            printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%.2f\t%s\n", t, k, w, r, n, ok, f, gcps,
                cpu, per, gen / tck, flag }' | tee -a "$OUT/results.tsv"
}

for t in $TRANSPORTS; do
    for w in $WORKERS_LIST; do
        i=0
        for rate in "${RATES[@]}"; do
            order=($PROXIES)
            if ((i % 2 == 1)); then order=($(printf '%s\n' "${order[@]}" | tac)); fi
            for kind in "${order[@]}"; do step "$t" "$kind" "$w" "$rate"; done
            i=$((i + 1))
        done
    done
done

echo
echo "capacity (highest rate with 0 failed or lost calls, generated at >= 90 % of the rate):"
awk -F'\t' 'NR > 1 && $12 == "" { key = $1 " " $2 " w" $3; if ($4 + 0 > cap[key]) { cap[key] = $4; cpc[key] = $10 } }
    END { for (k in cap) printf "  %-22s %6d calls/s   CPU %s us/call at that rate\n", k, cap[k], cpc[k] }' \
    "$OUT/results.tsv" | sort

if [[ "$HANDSHAKES" -gt 0 ]]; then
    echo
    echo "TLS handshakes ($HANDSHAKES connections, $PARALLEL at once, no ping):"
    printf "proxy\tworkers\topen\tfailed\thandshakes_per_s\tcpu_us_per_handshake\thandshakes_per_s_per_core\n" \
        | tee "$OUT/handshakes.tsv"
    for w in $WORKERS_LIST; do
        for kind in $PROXIES; do
            log="$OUT/handshakes-$kind-w$w"
            start_proxy "$kind" "$w" "$log"
            sleep 0.5
            "$RINGWAY" sip idle --to tls:127.0.0.1:5061 --tls-ca "$OUT/ca.pem" \
                --connections "$HANDSHAKES" --parallel "$PARALLEL" --no-ping --settle-s 0 \
                --server-pid "$PROXY_PID" --json "$log.json" >"$log.idle.txt" 2>&1 || true
            stop_pid "$PROXY_PID"
            PIDS=()
            python3 - "$log.json" "$kind" "$w" <<'PY' | tee -a "$OUT/handshakes.tsv"
import json, sys
path, kind, w = sys.argv[1:]
try:
    s = json.load(open(path))
except (OSError, ValueError):
    print(f"{kind}\t{w}\tn/a\tn/a\tn/a\tn/a\tn/a")
    sys.exit(0)
us = (s.get("server") or {}).get("cpu_us_per_connection")
print(f"{kind}\t{w}\t{s['open']}\t{sum(s['failed'].values())}\t{s['opened_per_s']:.0f}\t"
      + ("n/a\tn/a" if not us else f"{us:.0f}\t{1e6 / us:.0f}"))
PY
        done
    done
fi
