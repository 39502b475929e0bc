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
# ringway runs once with UDP GSO (--gso on) and once without (--gso off);
# GSO=on or GSO=off runs only that one.
#
# Usage: bench/siplab/gen-vs-sipp.sh            (env: RATE=1000 CALLS=20000 PROXY=none|kamailio RINGWAY=path GSO=both|on|off)
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
GSO=${GSO:-both}
case "$GSO" in both) GSOS="on off";; on|off) GSOS=$GSO;; *) echo "GSO must be both, on or off" >&2; exit 1;; esac
RINGWAY=${RINGWAY:-$ROOT/target/release/ringway}
[ -x "$RINGWAY" ] || { echo "ringway binary $RINGWAY not found (cargo build --release -p ringway, or RINGWAY=...)" >&2; exit 1; }
command -v sipp >/dev/null || { echo "sipp not installed" >&2; exit 1; }
case "$RATE$CALLS" in *[!0-9]*) echo "RATE and CALLS must be positive integers" >&2; exit 1;; esac
[ "$RATE" -gt 0 ] && [ "$CALLS" -gt 0 ] || { echo "RATE and CALLS must be > 0" >&2; exit 1; }
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
    timed timeout "$LIMIT" sipp -sn uac -r "$RATE" -m "$CALLS" -i 127.0.0.1 -p 5061 "${extra[@]}" \
        -nostdin -trace_stat -stf "$TMP/uac.csv" 127.0.0.1:5070 >/dev/null 2>&1
    UAC_CPU=$CPU
    # Successful calls from SIPp's statistics file (last line, SuccessfulCall(C)).
    UAC_OK=$(awk -F';' 'NR==1 { for (i=1;i<=NF;i++) if ($i=="SuccessfulCall(C)") c=i } END { print $c+0 }' "$TMP/uac.csv" 2>/dev/null || echo 0)
}
ringway_load() {
    local extra=()
    [ "$PROXY" = kamailio ] && extra+=(--proxy 127.0.0.1:5060)
    timed timeout "$LIMIT" "$RINGWAY" sip load --quiet --rate "$RATE" --calls "$CALLS" \
        --duration "$DURATION" --json "$TMP/rw.json" "${extra[@]}" "$@" >/dev/null
    RW_CPU=$CPU
    RW_OK=$(sed -n 's/^ *"succeeded": \([0-9]*\),/\1/p' "$TMP/rw.json")
}

echo "gen-vs-sipp: $CALLS calls at $RATE calls/s, proxy: $PROXY, ringway: $RINGWAY"
echo "kernel $(uname -r), $(nproc) CPUs, $(sipp -v 2>&1 | grep -o 'SIPp v[^ ]*')"

# A: both roles
start_sipp_uas; sipp_uac; stop_uas
A_SIPP_CPU=$(echo "$UAC_CPU + $UAS_CPU" | bc -l); A_SIPP_OK=$UAC_OK
declare -A A_RW_CPU A_RW_OK B_RW_CPU B_RW_OK
for g in $GSOS; do
    ringway_load --gso "$g"
    A_RW_CPU[$g]=$RW_CPU; A_RW_OK[$g]=$RW_OK
done
# B: UAC only, same SIPp UAS
start_sipp_uas; sipp_uac; stop_uas
B_SIPP_CPU=$UAC_CPU; B_SIPP_OK=$UAC_OK
for g in $GSOS; do
    start_sipp_uas; ringway_load --uas 127.0.0.1:5070 --gso "$g"; stop_uas
    B_RW_CPU[$g]=$RW_CPU; B_RW_OK[$g]=$RW_OK
done

per_call() { if [ "${2:-0}" -gt 0 ]; then echo "scale=2; 1000000 * $1 / $2" | bc -l; else echo n/a; fi; }
ratio() { if [ "$(echo "$2 > 0" | bc -l)" = 1 ]; then echo "scale=2; $1 / $2" | bc -l; else echo n/a; fi; }
printf '\n%-38s %10s %10s %12s\n' case "calls ok" "CPU s" "µs/call"
printf '%-38s %10s %10s %12s\n' "A sipp uac+uas" "$A_SIPP_OK" "$A_SIPP_CPU" "$(per_call "$A_SIPP_CPU" "$A_SIPP_OK")"
for g in $GSOS; do
    printf '%-38s %10s %10s %12s\n' "A ringway sip load (uac+uas) gso $g" "${A_RW_OK[$g]}" "${A_RW_CPU[$g]}" "$(per_call "${A_RW_CPU[$g]}" "${A_RW_OK[$g]}")"
done
printf '%-38s %10s %10s %12s\n' "B sipp uac (vs sipp uas)" "$B_SIPP_OK" "$B_SIPP_CPU" "$(per_call "$B_SIPP_CPU" "$B_SIPP_OK")"
for g in $GSOS; do
    printf '%-38s %10s %10s %12s\n' "B ringway uac (vs sipp uas) gso $g" "${B_RW_OK[$g]}" "${B_RW_CPU[$g]}" "$(per_call "${B_RW_CPU[$g]}" "${B_RW_OK[$g]}")"
done
echo
for g in $GSOS; do
    A_R=$(ratio "$(per_call "$A_SIPP_CPU" "$A_SIPP_OK")" "$(per_call "${A_RW_CPU[$g]}" "${A_RW_OK[$g]}")")
    B_R=$(ratio "$(per_call "$B_SIPP_CPU" "$B_SIPP_OK")" "$(per_call "${B_RW_CPU[$g]}" "${B_RW_OK[$g]}")")
    echo "calls per CPU-second, ringway (gso $g) / SIPp: A (both roles) ${A_R}x, B (UAC only) ${B_R}x (target >= 3x)"
done
