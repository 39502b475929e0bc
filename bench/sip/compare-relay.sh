#!/usr/bin/env bash
# Cost of the relay policy (issue 19): CPU per call of `ringway sip proxy`
# with the relay policy, signed Record-Route and the Via/branch MACs (this
# build) against an older build without them (e.g. the landed main copied
# aside), side by side in one run, under `ringway sip load` with its
# built-in UAS (INVITE/100/180/200, ACK, BYE/200 per call, Record-Routed, so
# the proxy signs one Record-Route and checks the signature of the ACK and
# the BYE). The two builds alternate, REPEAT times each per rate and mode,
# so the spread between runs of one build is the noise floor.
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`); the proxy is pinned to CPU 0, the
# generator to CPU 1; every process is started by this script and stopped
# by PID. Not a test: timings.
#
# Usage: bench/sip/compare-relay.sh OLD_RINGWAY [RATES...]  (default 2000 6000)
#   env: RINGWAY=path (default target/release/ringway)  SECS=5  REPEAT=2
#        MODES="stateless stateful"  OUT=/tmp/ringway-relay-bench
#        MAX_TRANSACTIONS=4000000 (both builds; the new one's byte bound too)
# Columns: build, mode, offered cps, attempted, ok, proxy CPU s (utime+stime
# of the proxy over the load, /proc/PID/stat), CPU us per successful call,
# proxy socket drops. A run whose generator fell behind (attempted under
# 97 % of rate*SECS) is flagged `behind`; one with failed calls or socket
# drops (the proxy or the machine could not keep up) `overload`. Flagged
# runs are left out of comparisons.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
OLD="${1:?usage: compare-relay.sh OLD_RINGWAY [RATES...]}"
shift
NEW="${RINGWAY:-$ROOT/target/release/ringway}"
SECS="${SECS:-5}"
REPEAT="${REPEAT:-2}"
MODES="${MODES:-stateless stateful}"
OUT="${OUT:-/tmp/ringway-relay-bench}"
# Stateful: every call leaves an INVITE and a BYE transaction for ~32 s
# (timers L and J), so the default table (100 000) would cap a 10-second
# run at 6 000 calls/s near 50 000 calls; raised out of the way for both.
MAX_TRANSACTIONS="${MAX_TRANSACTIONS:-4000000}"
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(2000 6000)
TCK="$(getconf CLK_TCK)"
mkdir -p "$OUT"

printf "build\tmode\trate_cps\tattempted\tok\tproxy_cpu_s\tcpu_us_per_call\tsocket_drops\tflag\n" | tee "$OUT/results.tsv"
for rate in "${RATES[@]}"; do
    for mode in $MODES; do
        for rep in $(seq 1 "$REPEAT"); do
            for build in old new; do
                log="$OUT/$build-$mode-$rate-$rep"
                rm -f "$log".*
                bin="$OLD"
                args=(--listen 127.0.0.1:5060 --mode "$mode" --workers 1 --cpus 0
                    --rcvbuf 4194304 --duration 3600 --quiet --summary "$log.summary.json"
                    --max-transactions "$MAX_TRANSACTIONS")
                if [[ $build == new ]]; then
                    bin="$NEW"
                    # The generator's UAS is on loopback (docs/security.md);
                    # the byte bound (new in issue 19) raised with the count.
                    args+=(--relay 127.0.0.0/8 --max-transaction-bytes 8589934592)
                fi
                "$bin" sip proxy "${args[@]}" 2>"$log.err" &
                proxy=$!
                PIDS+=("$proxy")
                wait_udp_port 5060
                sleep 0.3
                c0=$(proc_ticks "$proxy")
                taskset -c 1 "$NEW" sip load --proxy 127.0.0.1:5060 --rate "$rate" \
                    --calls $((rate * SECS)) --duration "$SECS" --threads 1 --quiet \
                    --json "$log.load.json" >/dev/null 2>"$log.load.err" || true
                c1=$(proc_ticks "$proxy")
                kill -TERM "$proxy"; wait "$proxy" 2>/dev/null || true
                read -r attempted ok < <(python3 -c "import json;s=json.load(open('$log.load.json'));print(s['attempted'], s['succeeded'])")
                drops=$(python3 -c "import json;print(json.load(open('$log.summary.json'))['drops']['socket_rxq_ovfl'])")
                flag="ok"
                [[ $attempted -lt $((rate * SECS * 97 / 100)) ]] && flag="behind"
                [[ $ok -lt $attempted || $drops -gt 0 ]] && flag="overload"
                awk -v b="$build" -v m="$mode" -v r="$rate" -v at="$attempted" -v ok="$ok" \
                    -v t=$((c1 - c0)) -v tck="$TCK" -v d="$drops" -v fl="$flag" 'BEGIN{
                    cpu = t / tck; printf "%s\t%s\t%d\t%d\t%d\t%.2f\t%s\t%d\t%s\n", b, m, r, at, ok, cpu,
                    (ok > 0 ? sprintf("%.2f", cpu * 1e6 / ok) : "n/a"), d, fl }' | tee -a "$OUT/results.tsv"
            done
        done
    done
done
