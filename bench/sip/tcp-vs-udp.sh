#!/usr/bin/env bash
# SIP over TCP against UDP (issue 21), side by side in one run: SIPp UAC →
# `ringway sip proxy` → SIPp UAS, both UAs over UDP (`-t u1`) or both over
# TCP (`-t t1`, one connection each way), at a fixed offered rate, the two
# transports alternating REPEAT times so the spread of one transport is
# the noise floor. Not a test: timings.
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`); every process is started by this
# script and stopped by PID.
#
# Usage: bench/sip/tcp-vs-udp.sh [RATE] (default 500 calls/s)
#   env: RINGWAY=path (default target/release/ringway) SECS=6 REPEAT=2
#        MODE=stateful OUT=/tmp/ringway-tcp-bench
# Columns: transport, offered cps, successful, failed, proxy CPU s over the
# run (utime+stime, /proc/PID/stat), CPU µs per successful call. A run with
# failed calls is flagged `overload` and left out of comparisons.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
RATE="${1:-500}"
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
SECS="${SECS:-6}"
REPEAT="${REPEAT:-2}"
MODE="${MODE:-stateful}"
OUT="${OUT:-/tmp/ringway-tcp-bench}"
mkdir -p "$OUT"
CALLS=$((RATE * SECS))

cpu_s() { awk '{printf "%.3f", ($14 + $15) / 100}' "/proc/$1/stat"; }

run() {
    local t="$1" n="$2" dest="127.0.0.1:5070"
    [[ "$t" == t1 ]] && dest="127.0.0.1:5070;transport=tcp"
    "$RINGWAY" sip proxy --listen 127.0.0.1:5060 --listen tcp:127.0.0.1:5060 \
        --relay 127.0.0.0/8 --mode "$MODE" --duration 600 --quiet \
        --summary "$OUT/summary-$t-$n.json" 2>"$OUT/proxy-$t-$n.log" &
    local proxy=$!
    PIDS+=("$proxy")
    sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.1 -p 5070 -t "$t" -nostdin \
        >/dev/null 2>&1 &
    local uas=$!
    PIDS+=("$uas")
    sleep 0.5
    local c0
    c0=$(cpu_s "$proxy")
    sipp 127.0.0.1:5060 -sf "$HERE/uac_rr.xml" -s bob -key dest "$dest" \
        -i 127.0.0.1 -p 5061 -t "$t" -m "$CALLS" -r "$RATE" -l $((RATE * 2)) \
        -timeout $((SECS * 4)) -nostdin -trace_stat -fd 1 \
        -stf "$OUT/uac-$t-$n.csv" >/dev/null 2>&1 || true
    local c1
    c1=$(cpu_s "$proxy")
    kill "$uas" "$proxy" 2>/dev/null || true
    wait "$uas" "$proxy" 2>/dev/null || true
    local line head ok failed
    head=$(head -1 "$OUT/uac-$t-$n.csv")
    line=$(tail -1 "$OUT/uac-$t-$n.csv")
    col() { echo "$head" | tr ';' '\n' | grep -n "^$1\$" | cut -d: -f1; }
    ok=$(echo "$line" | cut -d';' -f"$(col 'SuccessfulCall(C)')")
    failed=$(echo "$line" | cut -d';' -f"$(col 'FailedCall(C)')")
    local cpu us flag=""
    cpu=$(echo "$c1 $c0" | awk '{printf "%.2f", $1 - $2}')
    us=$(echo "$cpu $ok" | awk '{ if ($2 > 0) printf "%.1f", $1 * 1e6 / $2; else print "n/a" }')
    [[ "$failed" != 0 ]] && flag=overload
    printf "%-4s %6s %8s %6s %8s %8s %s\n" "$t" "$RATE" "$ok" "$failed" "$cpu" "$us" "$flag"
}

printf "%-4s %6s %8s %6s %8s %8s\n" tr cps ok failed cpu_s us/call
for n in $(seq 1 "$REPEAT"); do
    run u1 "$n"
    run t1 "$n"
done
