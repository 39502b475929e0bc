#!/usr/bin/env bash
# Capacity (highest call rate with <1% failed calls) and CPU per call of
# `ringway sip proxy --mode stateless` vs Kamailio (stateless forward), under
# the same SIPp load (bench/sip/uac_rr.xml -> proxy -> bench/sip/uas_rr.xml).
#
# Everything runs inside a private network namespace that has only `lo`
# (the script re-executes itself under `unshare -n`). Every process is
# started by this script, tracked by PID and killed by PID.
#
# Usage: bench/sip/compare-kamailio.sh [RATES...]
#   env: RINGWAY=path/to/ringway (default: target/release/ringway)
#        WORKERS=2        proxy worker threads / Kamailio UDP children
#        SECS=10          seconds of load per step
#        PROXIES="ringway kamailio" (also ringway-shared, ringway-reuseport)
#        PAUSE_MS=20      call hold time (ms between ACK and BYE)
#        BACKEND=mmsg RX_MODEL=reuseport (ringway options)
#        RINGWAY_ARGS="--rcvbuf 4194304"  (extra ringway arguments)
#        OUT=/tmp/ringway-sip-bench (results: results.tsv, per-run logs)
# CPU per call = (utime+stime of all proxy processes/threads, from
# /proc/<pid>/stat, delta over the step) / successful calls.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

if [[ "${RINGWAY_BENCH_NETNS:-}" != "1" ]]; then
    exec env RINGWAY_BENCH_NETNS=1 unshare -n -- bash "$0" "$@"
fi
ip link set lo up

RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
WORKERS="${WORKERS:-2}"
SECS="${SECS:-10}"
PAUSE_MS="${PAUSE_MS:-20}"
PROXIES="${PROXIES:-ringway kamailio}"
BACKEND="${BACKEND:-mmsg}"
RX_MODEL="${RX_MODEL:-reuseport}"
OUT="${OUT:-/tmp/ringway-sip-bench}"
KAMCFG="${KAMCFG:-$ROOT/bench/kamailio/stateless.cfg}"
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(250 500 1000 2000 3000 4000 6000 8000)
TCK="$(getconf CLK_TCK)"
PROXY=127.0.0.1:5060
UAS=127.0.0.1:5070

mkdir -p "$OUT"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    sleep 0.5
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
    done
    PIDS=()
}
trap cleanup EXIT

# utime+stime ticks of a process and all its descendants (Kamailio forks
# children). Reads every /proc/<pid>/stat once: field 4 is the parent pid.
cpu_ticks() {
    local root=$1
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$root" '{
        line = $0; sub(/^.*\) /, "", line); split(line, f, " ");
        pid = $1; ppid[pid] = f[2]; ticks[pid] = f[12] + f[13] }
        END {
            keep[root] = 1; changed = 1;
            while (changed) { changed = 0;
                for (p in ppid) if (!(p in keep) && (ppid[p] in keep)) { keep[p] = 1; changed = 1 } }
            t = 0; for (p in keep) t += ticks[p]; print t }'
}

wait_udp_port() {
    local port=$1 i
    for i in $(seq 1 100); do
        if ss -Huln "sport = :$port" | grep -q .; then return 0; fi
        sleep 0.05
    done
    echo "port $port never opened" >&2
    return 1
}

start_proxy() {
    local kind=$1 log=$2
    case "$kind" in
    ringway | ringway-shared | ringway-reuseport)
        local model="$RX_MODEL"
        [[ "$kind" == ringway-shared ]] && model=shared
        [[ "$kind" == ringway-reuseport ]] && model=reuseport
        "$RINGWAY" sip proxy --listen "$PROXY" --mode stateless --workers "$WORKERS" \
            --backend "$BACKEND" --rx-model "$model" --duration 3600 --quiet ${RINGWAY_ARGS:-} \
            --summary "$log.summary.json" 2>"$log.err" &
        ;;
    kamailio)
        local run="$OUT/kam-run"
        mkdir -p "$run"
        /usr/sbin/kamailio -DD -E -f "$KAMCFG" -l "udp:$PROXY" -n "$WORKERS" \
            -P "$run/kamailio.pid" -Y "$run" -m 64 -M 8 2>"$log.err" &
        ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_udp_port 5060
}

stop_pid() {
    local p=$1 i
    kill -TERM "$p" 2>/dev/null || true
    for i in $(seq 1 100); do
        kill -0 "$p" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}

csv_field() { # file column-name -> value on the last line
    awk -F';' -v col="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==col) c=i} END{print $c}' "$1"
}

printf "proxy\trate_cps\tcalls\tok\tfailed\tfail_pct\tachieved_cps\tcpu_s\tcpu_us_per_call\n" >"$OUT/results.tsv"
echo "results: $OUT/results.tsv   (netns: private, lo only; CLK_TCK=$TCK)"

for kind in $PROXIES; do
    for rate in "${RATES[@]}"; do
        log="$OUT/$kind-$rate"
        rm -f "$log".*
        sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.1 -p 5070 -nostdin -max_socket 4096 \
            >/dev/null 2>"$log.uas.err" &
        UAS_PID=$!
        PIDS+=("$UAS_PID")
        wait_udp_port 5070
        start_proxy "$kind" "$log"
        sleep 0.5
        calls=$((rate * SECS))
        c0=$(cpu_ticks "$PROXY_PID")
        t0=$(date +%s.%N)
        timeout $((SECS * 3 + 60)) sipp "$PROXY" -sf "$HERE/uac_rr.xml" -s bob \
            -key dest "$UAS" -i 127.0.0.1 -p 5061 -m "$calls" -r "$rate" -rp 1000 \
            -l $((rate * 4 + 100)) -d "$PAUSE_MS" -timeout $((SECS * 3 + 30)) -nostdin \
            -trace_stat -stf "$log.uac.csv" -fd 1 >/dev/null 2>"$log.uac.err" || true
        t1=$(date +%s.%N)
        c1=$(cpu_ticks "$PROXY_PID")
        stop_pid "$PROXY_PID"
        stop_pid "$UAS_PID"
        PIDS=()
        ok=$(csv_field "$log.uac.csv" "SuccessfulCall(C)")
        failed=$(csv_field "$log.uac.csv" "FailedCall(C)")
        ok=${ok:-0}
        failed=${failed:-0}
        read -r pct ach cpu per < <(awk -v ok="$ok" -v f="$failed" -v n="$calls" \
            -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" -v tck="$TCK" 'BEGIN{
                tot = ok + f; lost = n - ok; if (lost < f) lost = f;
                pct = 100.0 * lost / n; cpu = (c1 - c0) / tck;
                per = ok > 0 ? cpu * 1e6 / ok : 0;
                printf "%.2f %.1f %.3f %.1f\n", pct, ok / (t1 - t0), cpu, per }')
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$kind" "$rate" "$calls" "$ok" "$failed" \
            "$pct" "$ach" "$cpu" "$per" | tee -a "$OUT/results.tsv"
    done
done

echo
echo "capacity (highest offered rate with <1% failed-or-missing calls; achieved_cps is"
echo "successful calls / UAC run time, which includes SIPp waiting out failed calls):"
awk -F'\t' 'NR>1 && $6 < 1.0 { if ($2 > cap[$1]) { cap[$1] = $2; cpc[$1] = $9 } }
    END { for (k in cap) printf "  %-17s %6d cps   CPU %.1f us/call at that rate\n", k, cap[k], cpc[k] }' \
    "$OUT/results.tsv"
