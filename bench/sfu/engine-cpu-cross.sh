#!/usr/bin/env bash
# SFU engine CPU per packet with the server and the load generator from
# different builds, crossed: `lab sfu` runs both in one process, so an A/B
# of two builds swaps the generator (pacing, batching, how its sockets
# wait) together with the engine, and the engine's system time includes
# the loopback delivery into the generator's sockets. Here `ringway sfu
# serve` (SERVE build) and `ringway sfu load` (LOAD build) are separate
# processes, placed as `lab sfu --cpus 0 --load-cpus 1` places them: the
# engine thread on CPU 0, the clients on CPU 1; mmsg, flush per packet
# (lab sfu's defaults), 8 clients x 3 streams at `--interval-ms 2` (1 500
# pps per client).
#
# Everything runs in a private network namespace with only `lo` (the
# script re-executes itself under `unshare -n`); every process is started
# by this script and stopped by PID. Not a test: timings. Run it on a quiet
# machine; alternate; the spread between runs of one pair is the noise
# floor.
#
# Usage: bench/sfu/engine-cpu-cross.sh LABEL=SERVE_BIN:LOAD_BIN[:ENV=VALUE] ...
#   e.g. bench/sfu/engine-cpu-cross.sh old=/tmp/ringway-main:/tmp/ringway-main \
#          new=target/release/ringway:target/release/ringway \
#          newserve=target/release/ringway:/tmp/ringway-main \
#          oldserve=/tmp/ringway-main:target/release/ringway
#   (ENV=VALUE is put in the server's environment.)
#   env: SECS=8 (measured window, after a 2 s warm-up)  REPEAT=3  CLIENTS=8
#        INTERVAL_MS=2  BACKEND=mmsg  OUT=/tmp/ringway-sfu-cross
#        COUNTS=1 (perf stat of the engine thread over the window: system
#        calls by kind and context switches, per packet: counts, valid on a
#        loaded machine too; OUT/LABEL-REP.counts)
# Columns: label, rep, media packets the engine accepted and its CPU time
# (user + system, the server's JSON report: the whole run), engine CPU us
# per packet, the server socket's drops (a run with drops, or whose clients
# fell behind, ran on a machine too busy for it); then the median and
# range per label. COUNTS are over the window after the warm-up.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
[[ $# -ge 1 ]] || { sed -n '2,31p' "$0"; exit 2; }
SECS="${SECS:-8}"
REPEAT="${REPEAT:-3}"
CLIENTS="${CLIENTS:-8}"
INTERVAL_MS="${INTERVAL_MS:-2}"
BACKEND="${BACKEND:-mmsg}"
OUT="${OUT:-/tmp/ringway-sfu-cross}"
COUNTS="${COUNTS:-0}"
WARMUP=2
PORT=4433
mkdir -p "$OUT"
LABELS=()
declare -A SERVE LOAD SENV
for spec in "$@"; do
    label="${spec%%=*}"
    rest="${spec#*=}"
    IFS=: read -r serve load env <<<"$rest"
    LABELS+=("$label")
    SERVE[$label]="$serve"
    LOAD[$label]="$load"
    SENV[$label]="${env:-}"
done
engine_tid() {
    local t
    for t in /proc/"$1"/task/*; do
        [[ "$(cat "$t/comm" 2>/dev/null)" == sfu-engine ]] && { basename "$t"; return 0; }
    done
    return 1
}

printf "label\trep\tpackets\tengine_cpu_ms\tcpu_us_per_packet\tsocket_drops\n" | tee "$OUT/results.tsv"
for rep in $(seq 1 "$REPEAT"); do
    order=("${LABELS[@]}")
    if ((rep % 2 == 0)); then
        order=()
        for ((i = ${#LABELS[@]} - 1; i >= 0; i--)); do order+=("${LABELS[i]}"); done
    fi
    for label in "${order[@]}"; do
        log="$OUT/$label-$rep"
        rm -f "$log".*
        envs=()
        [[ -n ${SENV[$label]} ]] && envs=("${SENV[$label]}")
        env "${envs[@]}" "${SERVE[$label]}" sfu serve --listen "127.0.0.1:$PORT" --backend "$BACKEND" \
            --flush packet --cpus 0 --duration $((WARMUP + SECS + 10)) --stats-interval 0 \
            --json "$log.serve.json" >"$log.serve.out" 2>&1 &
        serve=$!
        PIDS+=("$serve")
        for _ in $(seq 1 100); do
            ss -Huln "sport = :$PORT" | grep -q . && break
            sleep 0.05
        done
        "${LOAD[$label]}" sfu load --server "127.0.0.1:$PORT" --clients "$CLIENTS" \
            --interval-ms "$INTERVAL_MS" --duration $((WARMUP + SECS + 1)) --backend mmsg \
            --cpus 1 --stats-interval 0 --json "$log.load.json" >"$log.load.out" 2>&1 &
        load=$!
        PIDS+=("$load")
        sleep "$WARMUP"
        tid="$(engine_tid "$serve")"
        if [[ $COUNTS == 1 ]]; then
            events=raw_syscalls:sys_enter,context-switches
            for call in recvmmsg sendmmsg recvfrom sendto recvmsg sendmsg epoll_pwait2 epoll_wait ppoll getsockopt; do
                events+=",syscalls:sys_enter_$call"
            done
            perf stat -x, -e "$events" -t "$tid" -o "$log.perfstat" -- sleep "$SECS" 2>/dev/null
        else
            sleep "$SECS"
        fi
        wait "$load" 2>/dev/null || true
        kill -INT "$serve"
        wait "$serve" 2>/dev/null || true
        read -r packets cpu_s drops < <(python3 -c "import json; d = json.load(open('$log.serve.json')); \
print(d['sfu']['media_accepted'], d['cpu']['user_s'] + d['cpu']['sys_s'], d['io'].get('rx_dropped', 0))")
        awk -v l="$label" -v r="$rep" -v p="$packets" -v c="$cpu_s" -v d="$drops" 'BEGIN {
            printf "%s\t%d\t%d\t%.1f\t%.2f\t%d\n", l, r, p, c * 1e3, c * 1e6 / p, d }' | tee -a "$OUT/results.tsv"
        if [[ $COUNTS == 1 ]]; then
            awk -F, -v p="$packets" '$1 ~ /^[0-9]+$/ { printf "  %-32s %10d  %.3f per packet\n", $3, $1, $1 / p }' \
                "$log.perfstat" | tee "$log.counts"
        fi
    done
done
echo
echo "engine CPU us per packet: label, n, median, min..max"
python3 - "$OUT/results.tsv" "${LABELS[@]}" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for label in sys.argv[2:]:
    values = sorted(float(r["cpu_us_per_packet"]) for r in rows if r["label"] == label)
    print(f"{label}\t{len(values)}\t{statistics.median(values):.2f}\t{values[0]:.2f}..{values[-1]:.2f}")
EOF
