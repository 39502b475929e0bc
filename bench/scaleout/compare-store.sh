#!/usr/bin/env bash
# The Redis location store against the in-memory one, side by side in one
# run: `ringway sip proxy --registrar` (stateful, one worker) with
# `--location memory` and with `--location redis://...` (a redis-server this
# script starts, append-only file on, fsync every second), under the same
# SIPp loads:
#   1. registrations: register_many.xml, a new AOR per REGISTER, at RATE/s
#      for SECS s: REGISTERs answered 200 per second, failures,
#      retransmissions, proxy CPU (SIPp sends no BYE after a refused
#      REGISTER: -default_behaviors all,-bye);
#   2. calls: a SIPp UAS registers alice, then uac_rr.xml calls
#      alice@ringway.test (each INVITE looks her up) at CPS for SECS s:
#      successful calls, failures, retransmissions, proxy CPU, and from the
#      proxy's summary the INVITE's T_sip (time inside the core on the
#      worker, which includes the lookup with the in-memory store) and, with
#      Redis, the lookup's time added per call (receive -> resumed and sent,
#      location.lookup.added) and the Redis round trip alone
#      (location.lookup.store), p50/p99; and from the registrations run
#      the same two for REGISTERs (location.register.added/.store).
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`); every process is started by this
# script and stopped by PID. Not a test: timings. On a shared 2-vCPU machine
# SIPp, the proxy and Redis compete for the CPUs: compare the two stores as
# ratios within one run, and rerun on a quiet machine for figures.
#
# Usage: bench/scaleout/compare-store.sh [REG_RATE [CPS]]   (default 2000 300)
#   env: RINGWAY=path (default target/release/ringway)  SECS=5
#        OUT=/tmp/ringway-store-bench  THREADS=2 (store threads)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
if [[ "${RINGWAY_BENCH_NETNS:-}" != "1" ]]; then
    exec env RINGWAY_BENCH_NETNS=1 unshare -n -- bash "$0" "$@"
fi
ip link set lo up
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
SECS="${SECS:-5}"
THREADS="${THREADS:-2}"
OUT="${OUT:-/tmp/ringway-store-bench}"
REG_RATE="${1:-2000}"
CPS="${2:-300}"
TCK="$(getconf CLK_TCK)"
mkdir -p "$OUT"
rm -rf "$OUT/redis" && mkdir -p "$OUT/redis"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
ticks() { awk '{ line = $0; sub(/^.*\) /, "", line); split(line, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
wait_port() {
    local i
    for i in $(seq 1 100); do
        ss -Hln "sport = :$1" 2>/dev/null | grep -q . && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    return 1
}
csv_field() { awk -F';' -v col="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==col) c=i} END{print $c}' "$1"; }

redis-server --port 6390 --bind 127.0.0.1 --save '' --appendonly yes --appendfsync everysec \
    --dir "$OUT/redis" --daemonize no >"$OUT/redis.log" 2>&1 &
PIDS+=("$!")
wait_port 6390

start_proxy() { # store log
    local location=memory
    [[ $1 == redis ]] && location=redis://127.0.0.1:6390/0
    "$RINGWAY" sip proxy --listen 127.0.0.1:5060 --relay 127.0.0.0/8 --mode stateful --registrar --domain ringway.test \
        --workers 1 --rcvbuf 4194304 --location "$location" --location-threads "$THREADS" \
        --duration 3600 --quiet --summary "$2.summary.json" 2>"$2.err" &
    PROXY=$!
    PIDS+=("$PROXY")
    wait_port 5060
    sleep 0.3
}
stop_proxy() {
    kill -TERM "$PROXY"
    wait "$PROXY" || true
}

printf "load\tstore\toffered_per_s\tok\tfailed\tok_per_s\tretrans\tproxy_cpu_s\tcpu_us_per_ok\n" | tee "$OUT/results.tsv"
printf "store\tinvite_t_sip_p50_us\tinvite_t_sip_p99_us\tlookup_added_p50_us\tlookup_added_p99_us\tlookup_redis_p50_us\tlookup_redis_p99_us\tregister_added_p50_us\tregister_added_p99_us\tregister_redis_p50_us\tregister_redis_p99_us\n" >"$OUT/latency.tsv"
for store in memory redis; do
    # 1. Registrations.
    log="$OUT/register-$store"
    redis-cli -p 6390 FLUSHALL >/dev/null
    start_proxy "$store" "$log"
    c0=$(ticks "$PROXY")
    t0=$(date +%s.%N)
    timeout $((SECS * 4 + 60)) sipp 127.0.0.1:5060 -sf "$HERE/register_many.xml" \
        -key domain ringway.test -key contact 127.0.0.1:5099 -i 127.0.0.1 -p 5061 \
        -m $((REG_RATE * SECS)) -r "$REG_RATE" -l $((REG_RATE * 2 + 100)) -buff_size 4194304 \
        -default_behaviors all,-bye \
        -nostdin -timeout $((SECS * 3 + 30)) -trace_stat -fd 1 -stf "$log.csv" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    c1=$(ticks "$PROXY")
    stop_proxy
    ok=$(csv_field "$log.csv" 'SuccessfulCall(C)')
    failed=$(csv_field "$log.csv" 'FailedCall(C)')
    retrans=$(csv_field "$log.csv" 'Retransmissions(C)')
    awk -v s="$store" -v r="$REG_RATE" -v ok="$ok" -v f="$failed" -v rt="$retrans" \
        -v c=$((c1 - c0)) -v tck="$TCK" -v t0="$t0" -v t1="$t1" 'BEGIN {
        cpu = c / tck; el = t1 - t0
        printf "register\t%s\t%d\t%d\t%d\t%.0f\t%d\t%.2f\t%.1f\n", s, r, ok, f, ok / el, rt, cpu,
            (ok > 0 ? cpu * 1e6 / ok : 0) }' | tee -a "$OUT/results.tsv"

    # 2. Calls to a registered user.
    log="$OUT/calls-$store"
    redis-cli -p 6390 FLUSHALL >/dev/null
    start_proxy "$store" "$log"
    sipp -sf "$ROOT/bench/sip/uas_rr.xml" -i 127.0.0.1 -p 5070 -nostdin -buff_size 4194304 \
        >/dev/null 2>"$log.uas.err" &
    uas=$!
    PIDS+=("$uas")
    wait_port 5070
    timeout 30 sipp 127.0.0.1:5060 -sf "$ROOT/bench/sip/register.xml" -s alice \
        -key domain ringway.test -key contact 127.0.0.1:5070 -i 127.0.0.1 -p 5062 -m 1 \
        -nostdin -timeout 20 >/dev/null 2>&1
    c0=$(ticks "$PROXY")
    t0=$(date +%s.%N)
    timeout $((SECS * 4 + 60)) sipp 127.0.0.1:5060 -sf "$ROOT/bench/sip/uac_rr.xml" -s alice \
        -key dest ringway.test -i 127.0.0.1 -p 5061 -m $((CPS * SECS)) -r "$CPS" \
        -l $((CPS * 4 + 100)) -d 20 -buff_size 4194304 -nostdin -timeout $((SECS * 3 + 30)) \
        -trace_stat -fd 1 -stf "$log.csv" >/dev/null 2>&1 || true
    t1=$(date +%s.%N)
    c1=$(ticks "$PROXY")
    stop_proxy
    kill -TERM "$uas" 2>/dev/null || true
    wait "$uas" 2>/dev/null || true
    ok=$(csv_field "$log.csv" 'SuccessfulCall(C)')
    failed=$(csv_field "$log.csv" 'FailedCall(C)')
    retrans=$(csv_field "$log.csv" 'Retransmissions(C)')
    awk -v s="$store" -v r="$CPS" -v ok="$ok" -v f="$failed" -v rt="$retrans" \
        -v c=$((c1 - c0)) -v tck="$TCK" -v t0="$t0" -v t1="$t1" 'BEGIN {
        cpu = c / tck; el = t1 - t0
        printf "calls\t%s\t%d\t%d\t%d\t%.0f\t%d\t%.2f\t%.1f\n", s, r, ok, f, ok / el, rt, cpu,
            (ok > 0 ? cpu * 1e6 / ok : 0) }' | tee -a "$OUT/results.tsv"
    # Lookups from the calls run, REGISTERs from the registrations run.
    jq -r -n --arg s "$store" --slurpfile c "$log.summary.json" \
        --slurpfile r "$OUT/register-$store.summary.json" '[$s,
        $c[0].by_type.INVITE.t_sip.p50_us, $c[0].by_type.INVITE.t_sip.p99_us,
        ($c[0].location.lookup.added.p50_us // "n/a"), ($c[0].location.lookup.added.p99_us // "n/a"),
        ($c[0].location.lookup.store.p50_us // "n/a"), ($c[0].location.lookup.store.p99_us // "n/a"),
        ($r[0].location.register.added.p50_us // "n/a"), ($r[0].location.register.added.p99_us // "n/a"),
        ($r[0].location.register.store.p50_us // "n/a"), ($r[0].location.register.store.p99_us // "n/a")]
        | map(if type == "number" then (. * 10 | round / 10) else . end) | @tsv' >>"$OUT/latency.tsv"
done
echo
column -t "$OUT/latency.tsv"
echo "(files in $OUT)"
