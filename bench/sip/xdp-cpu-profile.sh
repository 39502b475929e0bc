#!/usr/bin/env bash
# Where the SIP proxy host's CPU per call goes on AF_XDP (issue 23): one
# `ringway lab sip --netns` run of ringway on the xdp backend (one worker,
# the proxy and its veth's NAPI thread pinned to PROXY_CPU, the generator
# on the other CPU) while `perf record -e cpu-clock -C PROXY_CPU -g`
# samples that CPU; then the samples of the proxy's threads and of its
# NAPI thread are folded into categories (bench/sip/fold-cpu-profile.py):
# share of the proxy host's CPU and µs per call. Other tasks on that CPU
# are counted and named, not charged (a shared machine shows there how
# noisy the run was). The lab creates and deletes its own namespaces.
#
# Usage: sudo bench/sip/xdp-cpu-profile.sh [RATE] [REPS]     (default 2000 1)
#   env: RINGWAY=path/to/ringway (default target/release/ringway)
#        OUT=/tmp/ringway-xdp-profile   HZ=4999   DURATION=10
# Needs perf (software clock only: no hardware counters needed) and root
# (kernel symbols from /proc/kallsyms).
set -euo pipefail

RATE=${1:-2000}
REPS=${2:-1}
RINGWAY=${RINGWAY:-target/release/ringway}
OUT=${OUT:-/tmp/ringway-xdp-profile}
HZ=${HZ:-4999}
DURATION=${DURATION:-10}
PROXY_CPU=0
HERE=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$OUT"
for rep in $(seq 1 "$REPS"); do
    dir="$OUT/rep$rep"
    rm -rf "$dir"
    mkdir -p "$dir"
    "$RINGWAY" lab sip --netns --proxy ringway --backends xdp --workers 1 --cores 1 \
        --proxy-cpus "$PROXY_CPU" --gen-cpus 1 --rates "$RATE" --reps 1 \
        --duration "$DURATION" --out "$dir/lab" >"$dir/lab.log" 2>&1 &
    lab=$!
    perf record -e cpu-clock -C "$PROXY_CPU" -g -F "$HZ" -o "$dir/perf.data" \
        >"$dir/perf.log" 2>&1 &
    perf_pid=$!
    lab_rc=0
    wait "$lab" || lab_rc=$?
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    if [ "$lab_rc" -ne 0 ]; then
        echo "lab run $rep failed ($lab_rc): $dir/lab.log" >&2
        exit 1
    fi
    grep -o 'PDR.*' "$dir/lab.log" | head -1 || true
    perf script -i "$dir/perf.data" -F comm,tid,cpu,time,ip,sym,dso 2>/dev/null \
        >"$dir/script.txt"
done

calls=$(python3 -c '
import json, sys
total = 0
for path in sys.argv[1:]:
    for line in open(path):
        total += json.loads(line).get("succeeded") or 0
print(total)' "$OUT"/rep*/lab/veth/runs.jsonl)
cat "$OUT"/rep*/script.txt | python3 "$HERE/fold-cpu-profile.py" "$PROXY_CPU" "$calls" "$HZ" \
    | tee "$OUT/profile.md"
