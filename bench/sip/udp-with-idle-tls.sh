#!/usr/bin/env bash
# Are UDP calls unchanged while many TLS connections sit open? (issue 21:
# "UDP calls/s unchanged ... while 10,000 TLS connections are open".)
# `ringway sip load` (the project's own generator, built-in UAS; on CPU 1)
# -> ringway (on CPU 0) -> back, over UDP at each RATE for SECS, in two arms
# on one proxy process: `idle0` (no other connection) and `idleN`
# (`ringway sip idle` holds IDLE TLS connections to the proxy's tls:
# listener, each handshaken and one CRLF keep-alive answered, then idle).
# The arms alternate A B B A ... (REPEAT runs of each per rate; the idle
# connections stay open across two adjacent idleN runs), so a drift of
# the machine falls on both.
#
# Per run: calls scheduled, attempted, successful, failed (and failed %),
# the generator's mean start lag and socket drops, the proxy's CPU
# (utime+stime) per successful call. A run whose generator fell behind
# (attempted < 99 % of scheduled, or a mean start lag over 10 ms) is
# flagged `generator-behind` and left out; one that lost calls is flagged
# `failed` (`failed<1%` when under 1 % of its calls).
# Per rate: the mean CPU per call of each arm (runs with 0 failed), their
# ratio idleN/idle0, and the noise floor: the largest relative spread
# (max-min)/mean among one arm's runs. An effect smaller than the floor is
# not one.
# Capacity per arm, two ways: the highest RATE whose runs all had 0 failed
# calls, and the highest whose runs all had < 1 % failed; each also per
# repetition (run k of each rate), whose spread is the capacity's noise
# floor, next to the ratio idleN/idle0 of the mean capacities. The rate
# grid's step bounds the resolution: a capacity effect smaller than one
# step is not seen.
#
# Everything runs in a private network namespace with only `lo` (the
# script re-executes itself under `unshare -n`); every process is started
# here and stopped by PID. The open-files limit is raised up to the hard
# limit (20 000 here without CAP_SYS_RESOURCE: IDLE at most about 19 000).
# Not a test: timings (run on a quiet machine; `uptime` is printed).
#
# Usage: bench/sip/udp-with-idle-tls.sh [RATES...]
#        (default 4000 8000 12000 14000 16000 18000 20000)
#   env: RINGWAY=path (default target/release/ringway)  IDLE=10000  SECS=10
#        REPEAT=3  WORKERS=1  MODE=stateful  SOURCES=2  PARALLEL=64
#        OUT=/tmp/ringway-udp-idle-tls (results.tsv, logs)
set -Eeuo pipefail
trap 'rc=$?; echo "udp-with-idle-tls.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
IDLE="${IDLE:-10000}"
SECS="${SECS:-10}"
REPEAT="${REPEAT:-3}"
WORKERS="${WORKERS:-1}"
MODE="${MODE:-stateful}"
SOURCES="${SOURCES:-2}"
PARALLEL="${PARALLEL:-64}"
OUT="${OUT:-/tmp/ringway-udp-idle-tls}"
METRICS=127.0.0.1:9090
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(4000 8000 12000 14000 16000 18000 20000)
TCK="$(getconf CLK_TCK)"
mkdir -p "$OUT"
# shellcheck source=lib-tcp-tls.sh
source "$HERE/lib-tcp-tls.sh"
ulimit -n 250000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
FILES=$(ulimit -n)
if ((IDLE + 200 > FILES)); then
    echo "IDLE=$IDLE does not fit the open files limit $FILES (raising it needs CAP_SYS_RESOURCE)" >&2
    exit 2
fi
make_cert
uptime | tee "$OUT/uptime.txt"

# The proxy on CPU 0 (all its threads: the UDP worker, the TLS loop, the
# timers), the generator and the idle client on CPU 1.
taskset -c 0 "$RINGWAY" sip proxy --listen 127.0.0.1:5060 --listen tls:127.0.0.1:5061 \
    --tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem" --relay 127.0.0.0/8 --mode "$MODE" \
    --workers "$WORKERS" --rcvbuf 4194304 --max-transactions 4000000 \
    --max-transaction-bytes 8589934592 --tcp-max-connections $((IDLE + 1000)) \
    --tcp-max-connections-per-ip $((IDLE + 1000)) --tcp-idle-timeout-s 36000 \
    --tls-max-handshakes 1024 --metrics "$METRICS" --duration 36000 --quiet \
    --summary "$OUT/proxy.summary.json" 2>"$OUT/proxy.err" &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_tcp_port 5061

# TLS connections open at the proxy now (its /metrics gauge).
tls_open() {
    python3 - "$METRICS" <<'PY'
import sys, urllib.request
try:
    body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
except OSError:
    print(-1)
    sys.exit(0)
want = 'ringway_sip_connections_open{transport="tls"} '
print(next((int(float(l[len(want):])) for l in body.splitlines() if l.startswith(want)), 0))
PY
}

# Wait (bounded) until the proxy holds exactly $1 TLS connections.
wait_tls_open() {
    local want=$1 i n
    for i in $(seq 1 1200); do
        n=$(tls_open)
        [[ "$n" -eq "$want" ]] && return 0
        sleep 0.1
    done
    echo "the proxy holds $n TLS connections, not $want" >&2
    return 1
}

# Stop tracking a process that is gone (its PID may be reused later).
untrack() {
    local q kept=()
    for q in "${PIDS[@]}"; do if [[ "$q" != "$1" ]]; then kept+=("$q"); fi; done
    PIDS=("${kept[@]}")
}

IDLE_PID=""
SOURCE_ARGS=()
for ((i = 0; i < SOURCES; i++)); do SOURCE_ARGS+=(--source "127.0.0.$((2 + i))"); done

# Open the idle connections (if not open) and wait until the proxy has them all.
idle_open() {
    [[ -n "$IDLE_PID" ]] && return 0
    taskset -c 1 "$RINGWAY" sip idle --to tls:127.0.0.1:5061 --tls-ca "$OUT/ca.pem" --connections "$IDLE" \
        "${SOURCE_ARGS[@]}" --parallel "$PARALLEL" --settle-s 0 --hold-s 86400 \
        --json "$OUT/idle-$(date +%s%N).json" >>"$OUT/idle.txt" 2>&1 &
    IDLE_PID=$!
    PIDS+=("$IDLE_PID")
    wait_tls_open "$IDLE"
}

# Close them (if open) and wait until the proxy has none.
idle_close() {
    [[ -z "$IDLE_PID" ]] && return 0
    stop_pid "$IDLE_PID"
    untrack "$IDLE_PID"
    IDLE_PID=""
    wait_tls_open 0
}

printf "rate\tarm\trun\tidle_tls\tscheduled\tattempted\tok\tfailed\tfailed_pct\tlag_us\tgen_drops\tcpu_s\tcpu_us_per_call\tflag\n" \
    | tee "$OUT/results.tsv"

# One run: RATE ARM RUN (the arm's connections already open or closed).
run() {
    local rate=$1 arm=$2 n=$3
    local log="$OUT/r$rate-$arm-$n" calls=$((rate * SECS))
    rm -f "$log".*
    local open c0 c1
    open=$(tls_open)
    c0=$(cpu_ticks "$PROXY_PID")
    taskset -c 1 "$RINGWAY" sip load --proxy 127.0.0.1:5060 --rate "$rate" --calls "$calls" \
        --duration "$SECS" --arrival constant --overload-control off --quiet \
        --json "$log.json" >"$log.out" 2>"$log.err" &
    local gen=$!
    PIDS+=("$gen")
    wait "$gen" 2>/dev/null || true
    untrack "$gen"
    c1=$(cpu_ticks "$PROXY_PID")
    python3 - "$log.json" "$rate" "$arm" "$n" "$open" "$c0" "$c1" "$TCK" <<'PY' | tee -a "$OUT/results.tsv"
import json, sys
path, rate, arm, n, open_, c0, c1, tck = sys.argv[1:9]
try:
    l = json.load(open(path))
except (OSError, ValueError):
    print("\t".join([rate, arm, n, open_] + ["-"] * 9 + ["no-summary"]))
    sys.exit(0)
cpu = (int(c1) - int(c0)) / int(tck)
ok, failed = l["succeeded"], l["failed_total"]
sched = l["attempted"] / max(l["scheduled"], 1)
pct = 100.0 * failed / max(l["attempted"], 1)
flag = ""
if sched < 0.99 or l["start_lag_mean_us"] > 10_000:
    flag = "generator-behind"
elif failed > 0 or ok < l["attempted"]:
    flag = "failed" if pct >= 1.0 else "failed<1%"
per = f"{cpu * 1e6 / ok:.1f}" if ok else "n/a"
print("\t".join(str(x) for x in [rate, arm, n, open_, l["scheduled"], l["attempted"], ok, failed,
      f"{pct:.3f}", round(l["start_lag_mean_us"]), l["rx_dropped"], f"{cpu:.2f}", per, flag]))
PY
}

# A B B A ...: the pairs of runs alternate their order, (idle0, idleN),
# (idleN, idle0), ..., so two idleN runs in a row share one opening.
for rate in "${RATES[@]}"; do
    for n in $(seq "$REPEAT"); do
        for slot in 0 1; do
            if (((n + slot) % 2 == 1)); then arm=idle0; else arm="idle$IDLE"; fi
            if [[ "$arm" == idle0 ]]; then idle_close; else idle_open; fi
            run "$rate" "$arm" "$n"
        done
    done
done
idle_close

echo
echo "per rate: mean CPU per call of each arm (runs with 0 failed, generator on schedule), ratio"
echo "idle$IDLE/idle0, noise floor (largest (max-min)/mean of one arm's runs); capacity: highest rate"
echo "whose runs all had 0 failed (and < 1 % failed), per arm and per repetition"
python3 - "$OUT/results.tsv" "$IDLE" <<'PY' | tee "$OUT/report.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
idle = f"idle{sys.argv[2]}"
arms = ("idle0", idle)
rates = sorted({int(r["rate"]) for r in rows})
def mean(xs):
    return sum(xs) / len(xs) if xs else None
def fmt(v, unit=""):
    return "n/a" if v is None else f"{v:.1f}{unit}"
def valid(r):
    return r["flag"] not in ("generator-behind", "no-summary")
def passed(r, lenient):
    return r["flag"] == "" or (lenient and r["flag"] == "failed<1%")
for rate in rates:
    per_arm, spreads = {}, []
    for arm in arms:
        runs = [r for r in rows if int(r["rate"]) == rate and r["arm"] == arm]
        good = [float(r["cpu_us_per_call"]) for r in runs if r["flag"] == "" and r["cpu_us_per_call"] != "n/a"]
        per_arm[arm] = mean(good)
        if len(good) >= 2 and mean(good):
            spreads.append((max(good) - min(good)) / mean(good))
        lost = [float(r["failed_pct"]) for r in runs if valid(r)]
        behind = sum(1 for r in runs if not valid(r))
        per_arm[arm + "-lost"] = (mean(lost), behind)
    a, b = per_arm["idle0"], per_arm[idle]
    ratio = f"{b / a:.3f}" if a and b else "n/a"
    floor = f"{max(spreads) * 100:.1f} %" if spreads else "n/a (fewer than 2 clean runs)"
    lost = ", ".join(f"{arm} {fmt(per_arm[arm + '-lost'][0], ' %')} failed"
                     + (f" ({per_arm[arm + '-lost'][1]} runs left out)" if per_arm[arm + '-lost'][1] else "")
                     for arm in arms)
    print(f"  {rate:>6} calls/s: idle0 {fmt(a)} us/call, {idle} {fmt(b)} us/call, "
          f"ratio {ratio}, noise floor {floor}; {lost}")
# Capacity: the highest rate whose (valid) runs all passed; None when none.
def capacity(arm, lenient, rep=None):
    best = None
    for rate in rates:
        runs = [r for r in rows if int(r["rate"]) == rate and r["arm"] == arm
                and (rep is None or int(r["run"]) == rep) and valid(r)]
        if runs and all(passed(r, lenient) for r in runs):
            best = rate
    return best
reps = sorted({int(r["run"]) for r in rows})
step = min((b - a) / a for a, b in zip(rates, rates[1:])) if len(rates) > 1 else None
for lenient, name in ((False, "0 failed"), (True, "< 1 % failed")):
    caps = {arm: capacity(arm, lenient) for arm in arms}
    per_rep = {arm: [capacity(arm, lenient, k) for k in reps] for arm in arms}
    means = {arm: mean([c for c in per_rep[arm] if c is not None]) for arm in arms}
    spreads = [(max(v) - min(v)) / mean(v) for v in
               ([c for c in per_rep[arm] if c is not None] for arm in arms) if len(v) >= 2 and mean(v)]
    ratio = f"{means[idle] / means['idle0']:.3f}" if means["idle0"] and means[idle] else "n/a"
    floor = f"{max(spreads) * 100:.1f} %" if spreads else "n/a"
    print(f"  capacity at {name}: " + ", ".join(
        f"{arm} {caps[arm] if caps[arm] is not None else 'n/a'} calls/s (per run: "
        + " ".join(str(c) if c is not None else "n/a" for c in per_rep[arm]) + ")" for arm in arms)
        + f"; ratio of the per-run means {ratio}, noise floor {floor}"
        + (f", rate step {step * 100:.0f} %" if step else ""))
PY
# SIGINT: stop at once and write the summary (SIGTERM would drain first).
kill -INT "$PROXY_PID" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
stop_pid "$PROXY_PID"
untrack "$PROXY_PID"
python3 -c "
import json; s = json.load(open('$OUT/proxy.summary.json'))
print('proxy tls:', {k: s['tls'][k] for k in ('handshakes', 'handshakes_refused', 'handshake_failures')})
print('proxy cpu:', s['cpu'])" 2>/dev/null || true
