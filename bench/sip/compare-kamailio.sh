#!/usr/bin/env bash
# Capacity (highest call rate with <1% failed calls, load generated at
# >= 90% of the offered rate) and CPU per call of
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
#        SIPP_ARGS="-buff_size 4194304"   (extra arguments for every SIPp)
#        OUT=/tmp/ringway-sip-bench (results: results.tsv, per-run logs)
#        PAIRS=1          SIPp UAC/UAS pairs sharing the offered load: pair i
#                         (0-based) has its UAC on port 5061+i and its UAS on
#                         5070+i (-key dest 127.0.0.1:5070+i); each UAC runs at
#                         RATE/PAIRS calls/s with RATE*SECS/PAIRS calls. Max 8.
# CPU per call = (utime+stime of all proxy processes/threads, from
# /proc/<pid>/stat, delta over the step) / successful calls (summed over the
# pairs). SIPp's own CPU (all UACs and UASs), its retransmissions, calls the
# UASs failed, and receive-buffer drops (proxy: skmem d of port 5060 in
# `ss -uam`; SIPp: the namespace's Udp RcvbufErrors minus the proxy's) are
# reported next to it, to tell whether the proxy or SIPp is the limit.
set -Eeuo pipefail
# Every failure says where and why (set -e alone exits without a word).
trap 'rc=$?; echo "compare-kamailio.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"

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
PAIRS="${PAIRS:-1}"
if ! [[ "$PAIRS" =~ ^[1-8]$ ]]; then
    echo "PAIRS must be 1..8 (UAC ports 5061+i, UAS ports 5070+i)" >&2
    exit 2
fi

mkdir -p "$OUT"

start_proxy() {
    local kind=$1 log=$2
    case "$kind" in
    ringway | ringway-shared | ringway-reuseport)
        local model="$RX_MODEL"
        [[ "$kind" == ringway-shared ]] && model=shared
        [[ "$kind" == ringway-reuseport ]] && model=reuseport
        "$RINGWAY" sip proxy --listen "$PROXY" --relay 127.0.0.0/8 --mode stateless --workers "$WORKERS" \
            --backend "$BACKEND" --rx-model "$model" --duration 3600 --quiet ${RINGWAY_ARGS:-} \
            --summary "$log.summary.json" 2>"$log.err" &
        ;;
    kamailio)
        local run="$OUT/kam-run"
        mkdir -p "$run"
        /usr/sbin/kamailio -DD -E -f "$KAMCFG" -l "udp:$PROXY" -n "$WORKERS" \
            -P "$run/kamailio.pid" -Y "$run" -m 64 -M 8 >"$log.out" 2>"$log.err" &
        ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_udp_port 5060
}

printf "proxy\tpairs\trate_cps\tcalls\tok\tfailed\tfail_pct\tachieved_cps\tgen_cps\tcpu_s\tcpu_us_per_call\tsipp_cpu_s\tretrans\tuas_failed\tproxy_drops\tsipp_drops\n" >"$OUT/results.tsv"
echo "results: $OUT/results.tsv   (netns: private, lo only; CLK_TCK=$TCK; PAIRS=$PAIRS)"

# Sum of a column's last value over several SIPp stat files.
csv_sum() {
    local col=$1 f v t=0
    shift
    for f in "$@"; do
        v=$(csv_field "$f" "$col" 2>/dev/null || true)
        t=$((t + ${v:-0}))
    done
    echo "$t"
}

# Receive-buffer drops: the namespace's Udp RcvbufErrors counter (all
# sockets here are the proxy's or SIPp's) and the proxy sockets' own drop
# count (skmem d, port 5060; sampled before the proxy is stopped).
rcvbuf_errors() {
    awk '/^Udp:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "RcvbufErrors") c = i; h = 1 } else print $c }' \
        /proc/net/snmp
}
proxy_drops() {
    ss -Huanm "sport = :5060" | awk '{ if (match($0, /,d[0-9]+\)/)) d += substr($0, RSTART + 2, RLENGTH - 3) }
        END { print d + 0 }'
}

for kind in $PROXIES; do
    for rate in "${RATES[@]}"; do
        log="$OUT/$kind-$rate"
        rm -f "$log".*
        UAS_PIDS=()
        for ((i = 0; i < PAIRS; i++)); do
            sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.1 -p $((5070 + i)) -nostdin -max_socket 4096 ${SIPP_ARGS:-} \
                -trace_stat -stf "$log.uas$i.csv" -fd 1 >/dev/null 2>"$log.uas$i.err" &
            UAS_PIDS+=($!)
            PIDS+=($!)
            wait_udp_port $((5070 + i))
        done
        start_proxy "$kind" "$log"
        sleep 0.5
        calls=$((rate * SECS))
        c0=$(cpu_ticks "$PROXY_PID")
        s0=0
        for p in "${UAS_PIDS[@]}"; do s0=$((s0 + $(cpu_ticks "$p"))); done
        e0=$(rcvbuf_errors)
        t0=$(date +%s.%N)
        UAC_PIDS=()
        UAC_CALLS=()
        for ((i = 0; i < PAIRS; i++)); do
            # Split calls exactly (the first pairs take the remainder);
            # per-pair rate may be fractional (SIPp's -r is a double).
            n=$((calls / PAIRS + (i < calls % PAIRS ? 1 : 0)))
            r=$(awk -v r="$rate" -v p="$PAIRS" 'BEGIN{printf "%g", r / p}')
            lim=$(awk -v r="$r" 'BEGIN{printf "%d", r * 4 + 100}')
            timeout $((SECS * 3 + 60)) sipp "$PROXY" -sf "$HERE/uac_rr.xml" -s bob \
                -key dest "127.0.0.1:$((5070 + i))" -i 127.0.0.1 -p $((5061 + i)) -m "$n" -r "$r" \
                -rp 1000 -l "$lim" -d "$PAUSE_MS" -timeout $((SECS * 3 + 30)) -nostdin ${SIPP_ARGS:-} \
                -trace_stat -stf "$log.uac$i.csv" -fd 1 >/dev/null 2>"$log.uac$i.err" &
            UAC_PIDS+=($!)
            UAC_CALLS+=("$n")
            PIDS+=($!)
        done
        # SIPp's CPU: each UAC runs under `timeout` (the PID we hold); sample
        # utime+stime+cutime+cstime of that PID (cutime covers SIPp once
        # `timeout` has reaped it) plus its live children, until it exits.
        sipp_uac_ticks=0
        for p in "${UAC_PIDS[@]}"; do
            last=0
            while kill -0 "$p" 2>/dev/null; do
                v=$( { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$p" '{
                    line = $0; sub(/^.*\) /, "", line); split(line, f, " ");
                    if ($1 == root) { t += f[12] + f[13] + f[14] + f[15]; if (f[1] == "Z") z = 1 }
                    else if (f[2] == root) t += f[12] + f[13] }
                    END { print t + 0, z + 0 }')
                [[ "${v% *}" -gt "$last" ]] && last=${v% *}
                [[ "${v#* }" == 1 ]] && break
                sleep 0.2
            done
            wait "$p" 2>/dev/null || true
            sipp_uac_ticks=$((sipp_uac_ticks + last))
        done
        t1=$(date +%s.%N)
        c1=$(cpu_ticks "$PROXY_PID")
        s1=0
        for p in "${UAS_PIDS[@]}"; do s1=$((s1 + $(cpu_ticks "$p"))); done
        pdrops=$(proxy_drops)
        sdrops=$(($(rcvbuf_errors) - e0 - pdrops))
        ((sdrops >= 0)) || sdrops=0
        stop_pid "$PROXY_PID"
        for p in "${UAS_PIDS[@]}"; do stop_pid "$p"; done
        PIDS=()
        uacs=()
        uass=()
        gmax=0
        for ((i = 0; i < PAIRS; i++)); do
            uacs+=("$log.uac$i.csv")
            uass+=("$log.uas$i.csv")
            g=$(gen_secs "$log.uac$i.csv" "${UAC_CALLS[$i]}" 2>/dev/null || true)
            if [[ -z "$g" || "$gmax" == -1 ]]; then
                gmax=-1
            else
                gmax=$(awk -v a="$gmax" -v b="$g" 'BEGIN{ print (b > a ? b : a) }')
            fi
        done
        ok=$(csv_sum "SuccessfulCall(C)" "${uacs[@]}")
        failed=$(csv_sum "FailedCall(C)" "${uacs[@]}")
        retrans=$(csv_sum "Retransmissions(C)" "${uacs[@]}" "${uass[@]}")
        uasfail=$(csv_sum "FailedCall(C)" "${uass[@]}")
        read -r pct ach gen cpu per scpu < <(awk -v ok="$ok" -v f="$failed" -v n="$calls" \
            -v t0="$t0" -v t1="$t1" -v c0="$c0" -v c1="$c1" -v tck="$TCK" -v g="$gmax" \
            -v s0="$s0" -v s1="$s1" -v su="$sipp_uac_ticks" 'BEGIN{
                lost = n - ok; if (lost < f) lost = f;
                pct = 100.0 * lost / n; cpu = (c1 - c0) / tck;
                per = ok > 0 ? cpu * 1e6 / ok : 0;
                gen = g > 0 ? sprintf("%.1f", n / g) : "-";
                printf "%.2f %.1f %s %.3f %.1f %.3f\n", pct, ok / (t1 - t0), gen, cpu, per,
                    (s1 - s0 + su) / tck }')
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$kind" "$PAIRS" \
            "$rate" "$calls" "$ok" "$failed" "$pct" "$ach" "$gen" "$cpu" "$per" "$scpu" \
            "$retrans" "$uasfail" "$pdrops" "$sdrops" | tee -a "$OUT/results.tsv"
    done
done

echo
echo "capacity (highest offered rate with <1% failed-or-missing calls and SIPp having"
echo "generated the load at >= 90% of the offered rate, gen_cps = calls / time until all"
echo "calls were created, 1 s resolution; achieved_cps = successful calls / UAC run time,"
echo "which includes SIPp waiting out failed calls, ~32 s for one lost INVITE):"
awk -F'\t' 'NR>1 && $7 < 1.0 && $9 != "-" && $9 >= 0.9 * $3 { if ($3 > cap[$1]) { cap[$1] = $3; cpc[$1] = $11 } }
    END { for (k in cap) printf "  %-17s %6d cps   CPU %.1f us/call at that rate\n", k, cap[k], cpc[k] }' \
    "$OUT/results.tsv"
