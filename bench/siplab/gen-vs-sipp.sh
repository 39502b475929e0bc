#!/bin/bash
# Generator CPU cost: `ringway sip load` vs SIPp, same calls at the same rate.
#
# Runs in a private network namespace with only `lo` (re-executes itself
# under `unshare -n`). For each case the same number of calls is driven at
# the same rate, and CPU-seconds (user+sys) are divided by the calls
# completed. CPU of the long-running SIPp UAS comes from /proc/<pid>/stat
# just before it is stopped; CPU of the generators that end by themselves
# from wait4() rusage (/usr/bin/time), which cannot miss their last ticks
# (bash reaps background children at once, so their /proc entry is gone).
#
#   A  SIPp UAC (-sn uac) + SIPp UAS (-sn uas)        vs  ringway sip load (UAC + built-in UAS)
#   B  SIPp UAC against a SIPp UAS                     vs  ringway UAC (--uas) against the same SIPp UAS
#
# With PROXY=kamailio every call goes through a stateless Kamailio
# (bench/kamailio/stateless.cfg); default: UAC -> UAS directly.
#
# ringway runs with its defaults (UDP GSO and GRO where available, automatic
# wakeup tick); RINGWAY_ARGS adds options (e.g. "--gso off --gro off" or
# "--tick-us 1000"). REPS repetitions, each running SIPp and ringway back to
# back (interleaved, so drift of the machine hits both); per-call CPU is
# reported as mean ± 95% CI over the repetitions, and the ratio per
# repetition, its mean ± CI and its worst value.
#
# Usage: bench/siplab/gen-vs-sipp.sh   (env: RATE=1000 CALLS=20000 REPS=3 PROXY=none|kamailio RINGWAY=path RINGWAY_ARGS=...)
set -euo pipefail

if [ -z "${RINGWAY_GEN_NETNS:-}" ]; then
    exec unshare -n env RINGWAY_GEN_NETNS=1 "$0" "$@"
fi
ip link set lo up

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RATE=${RATE:-1000}
CALLS=${CALLS:-20000}
PROXY=${PROXY:-none}
REPS=${REPS:-3}
read -r -a RW_EXTRA <<< "${RINGWAY_ARGS:-}"
RINGWAY=${RINGWAY:-$ROOT/target/release/ringway}
[ -x "$RINGWAY" ] || { echo "ringway binary $RINGWAY not found (cargo build --release -p ringway, or RINGWAY=...)" >&2; exit 1; }
command -v sipp >/dev/null || { echo "sipp not installed" >&2; exit 1; }
for v in "$RATE" "$CALLS" "$REPS"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "RATE, CALLS and REPS must be positive integers without leading zeros (got $v)" >&2; exit 1; }
done
[ "${BASH_VERSINFO[0]}" -gt 4 ] || { [ "${BASH_VERSINFO[0]}" -eq 4 ] && [ "${BASH_VERSINFO[1]}" -ge 4 ]; } \
    || { echo "needs bash >= 4.4 (empty arrays under set -u)" >&2; exit 1; }
DURATION=$(( CALLS / RATE + 5 ))
LIMIT=$(( DURATION + 60 ))   # hard bound for every process
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

HZ=$(getconf CLK_TCK)
# CPU seconds (user+sys) of a pid from /proc/<pid>/stat.
cpu_of() {
    awk -v hz="$HZ" '{ sub(/^.*\) /, ""); printf "%.3f", ($12 + $13) / hz }' "/proc/$1/stat"
}
# Run a command in the foreground; CPU seconds (user+sys) of it and its children to $CPU.
timed() {
    /usr/bin/time -f "%U %S" -o "$TMP/time" "$@" || true
    CPU=$(awk 'END { printf "%.3f", $1 + $2 }' "$TMP/time")
}
wait_port() {
    for _ in $(seq 200); do
        grep -q ":$(printf %04X "$1") " /proc/net/udp && return 0
        sleep 0.05
    done
    echo "nothing listens on port $1" >&2; exit 1
}

NEXT_HOP=127.0.0.1:5070
if [ "$PROXY" = kamailio ]; then
    kamailio -DD -E -f "$ROOT/bench/kamailio/stateless.cfg" -l udp:127.0.0.1:5060 -n 2 \
        -P "$TMP/k.pid" -Y "$TMP" -m 64 -M 8 >"$TMP/kamailio.log" 2>&1 &
    PIDS+=($!)
    wait_port 5060
    sleep 0.3
    NEXT_HOP=127.0.0.1:5060
elif [ "$PROXY" != none ]; then
    echo "PROXY must be none or kamailio" >&2; exit 1
fi

start_sipp_uas() {
    sipp -sn uas -i 127.0.0.1 -p 5070 -nostdin -timeout "$LIMIT" >/dev/null 2>&1 &
    UAS=$!; PIDS+=($UAS)
    wait_port 5070
}
stop_uas() {
    # SIPp's UAS never exits by itself: read its CPU, then stop it.
    sleep 0.5
    UAS_CPU=$(cpu_of "$UAS")
    kill "$UAS" 2>/dev/null || true; wait "$UAS" 2>/dev/null || true
}
sipp_uac() {
    local extra=()
    [ "$PROXY" = kamailio ] && extra=(-rsa 127.0.0.1:5060)
    rm -f "$TMP/uac.csv"
    timed timeout "$LIMIT" sipp -sn uac -r "$RATE" -m "$CALLS" -i 127.0.0.1 -p 5061 "${extra[@]}" \
        -nostdin -trace_stat -stf "$TMP/uac.csv" 127.0.0.1:5070 >/dev/null 2>&1
    UAC_CPU=$CPU
    # Successful calls from SIPp's statistics file (last line, SuccessfulCall(C)).
    UAC_OK=$(awk -F';' 'NR==1 { for (i=1;i<=NF;i++) if ($i=="SuccessfulCall(C)") c=i } END { print $c+0 }' "$TMP/uac.csv" 2>/dev/null || echo 0)
    [ -n "$UAC_OK" ] || UAC_OK=0
}
ringway_load() {
    local extra=()
    [ "$PROXY" = kamailio ] && extra+=(--proxy 127.0.0.1:5060)
    rm -f "$TMP/rw.json"
    timed timeout "$LIMIT" "$RINGWAY" sip load --quiet --rate "$RATE" --calls "$CALLS" \
        --duration "$DURATION" --json "$TMP/rw.json" "${extra[@]}" "${RW_EXTRA[@]}" "$@" >/dev/null
    RW_CPU=$CPU
    # No summary (killed, failed): no calls counted, so the row reads n/a.
    RW_OK=$(sed -n 's/^ *"succeeded": \([0-9]*\),/\1/p' "$TMP/rw.json" 2>/dev/null || true)
    RW_TICK=$(sed -n 's/^ *"tick_us": \([0-9]*\),/\1/p' "$TMP/rw.json" 2>/dev/null || true)
    [ -n "$RW_OK" ] || RW_OK=0
}

echo "gen-vs-sipp: $CALLS calls at $RATE calls/s, $REPS repetitions, proxy: $PROXY, ringway: $RINGWAY ${RW_EXTRA[*]}"
echo "kernel $(uname -r), $(nproc) CPUs, $(sipp -v 2>&1 | grep -o 'SIPp v[^ ]*')"

per_call() { if [ "${2:-0}" -gt 0 ]; then echo "scale=2; 1000000 * $1 / $2" | bc -l; else echo n/a; fi; }
ratio() { if [ "$1" != n/a ] && [ "$2" != n/a ] && [ "$(echo "$2 > 0" | bc -l)" = 1 ]; then echo "scale=2; $1 / $2" | bc -l; else echo n/a; fi; }
ROWS=$TMP/rows   # rep case who calls_ok cpu_s us_per_call
: > "$ROWS"
printf '\n%-4s %-34s %10s %8s %10s\n' rep case "calls ok" "CPU s" "µs/call"
row() {
    local us; us=$(per_call "${5:-0}" "${4:-0}")
    printf '%-4s %-34s %10s %8s %10s\n' "$1" "$2 $3" "$4" "$5" "$us"
    echo "$1 $2 $3 ${4:-0} ${5:-0} $us" >> "$ROWS"
}
for rep in $(seq "$REPS"); do
    # A: both roles
    start_sipp_uas; sipp_uac; stop_uas
    row "$rep" A sipp "$UAC_OK" "$(echo "$UAC_CPU + $UAS_CPU" | bc -l)"
    ringway_load
    row "$rep" A ringway "$RW_OK" "$RW_CPU"
    # B: UAC only, same SIPp UAS
    start_sipp_uas; sipp_uac; stop_uas
    row "$rep" B sipp "$UAC_OK" "$UAC_CPU"
    start_sipp_uas; ringway_load --uas 127.0.0.1:5070; stop_uas
    row "$rep" B ringway "$RW_OK" "$RW_CPU"
done
echo "ringway's wakeup tick: ${RW_TICK:-?} µs"

# mean ± 95% CI (Student t) of the numbers on stdin, and their minimum.
summary() {
    awk 'BEGIN { split("12.71 4.30 3.18 2.78 2.57 2.45 2.36 2.31 2.26 2.23 2.20 2.18 2.16 2.14 2.13 2.12 2.11 2.10 2.09 2.09 2.08 2.07 2.07 2.06 2.06 2.06 2.05 2.05 2.05 2.04", t, " ") }
         NF && $1 != "n/a" { x[++n] = $1; s += $1 }
         END {
           if (n == 0) { print "n/a"; exit }
           m = s / n; mn = x[1]
           for (i = 1; i <= n; i++) { v += (x[i] - m)^2; if (x[i] < mn) mn = x[i] }
           ci = 0
           if (n > 1) { q = (n - 1 <= 30) ? t[n - 1] : 2.0; ci = q * sqrt(v / (n - 1)) / sqrt(n) }
           printf "%.2f ± %.2f (min %.2f, n=%d)", m, ci, mn, n
         }'
}
echo
for c in A B; do
    for who in sipp ringway; do
        printf '%s %-8s µs/call: %s\n' "$c" "$who" "$(awk -v c=$c -v w=$who '$2 == c && $3 == w { print $6 }' "$ROWS" | summary)"
    done
    R=$(for rep in $(seq "$REPS"); do
        ratio "$(awk -v c=$c -v r=$rep '$1 == r && $2 == c && $3 == "sipp" { print $6 }' "$ROWS")" \
              "$(awk -v c=$c -v r=$rep '$1 == r && $2 == c && $3 == "ringway" { print $6 }' "$ROWS")"
    done)
    echo "$c calls per CPU-second ringway/SIPp per repetition: $(echo $R)"
    echo "$c ratio: $(echo "$R" | summary)  (target >= 3x)"
done
