#!/usr/bin/env bash
# Are UDP calls unchanged while many TLS connections sit open? (issue 21:
# "UDP calls/s unchanged ... while 10,000 TLS connections are open".)
# SIPp UAC -> ringway -> SIPp UAS over UDP at each RATE for SECS, in two
# arms on one proxy process: `idle0` (no other connection) and `idleN`
# (`ringway sip idle` holds IDLE TLS connections to the proxy's tls:
# listener, each handshaken and one CRLF keep-alive answered, then idle).
# The arms alternate A B B A ... (REPEAT runs of each per rate; the idle
# connections stay open across two adjacent idleN runs), so a drift of
# the machine falls on both.
#
# Per run: calls created, successful, failed, calls/s achieved, the proxy's
# CPU (utime+stime) per successful call, SIPp's mean response time. A run
# that lost calls is flagged `failed`; one whose generator created its
# calls at < 90 % of the rate, `generator-behind` (left out of the means).
# Per rate: the mean CPU per call of each arm, their ratio idleN/idle0,
# and the noise floor: the largest relative spread (max-min)/mean among
# one arm's runs. An effect smaller than the floor is not one. Capacity
# per arm: the highest RATE whose runs all had 0 failed calls.
#
# Everything runs in a private network namespace with only `lo` (the
# script re-executes itself under `unshare -n`); every process is started
# here and stopped by PID. The open-files limit is raised up to the hard
# limit (20 000 here without CAP_SYS_RESOURCE: IDLE at most about 19 000).
# Not a test: timings (run on a quiet machine; `uptime` is printed).
#
# Usage: bench/sip/udp-with-idle-tls.sh [RATES...]   (default 1000 2000 4000)
#   env: RINGWAY=path (default target/release/ringway)  IDLE=10000  SECS=10
#        REPEAT=3  WORKERS=1  MODE=stateful  SOURCES=2  PARALLEL=64
#        OUT=/tmp/ringway-udp-idle-tls (results.tsv, logs)
set -Eeuo pipefail
trap 'rc=$?; echo "udp-with-idle-tls.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
if [[ "${RINGWAY_BENCH_NETNS:-}" != "1" ]]; then
    exec env RINGWAY_BENCH_NETNS=1 unshare -n -- bash "$0" "$@"
fi
ip link set lo up
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
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
[[ ${#RATES[@]} -gt 0 ]] || RATES=(1000 2000 4000)
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

"$RINGWAY" sip proxy --listen 127.0.0.1:5060 --listen tls:127.0.0.1:5061 \
    --tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem" --relay 127.0.0.0/8 --mode "$MODE" \
    --workers "$WORKERS" --tcp-max-connections $((IDLE + 1000)) \
    --tcp-max-connections-per-ip $((IDLE + 1000)) --tcp-idle-timeout-s 36000 \
    --tls-max-handshakes 1024 --metrics "$METRICS" --duration 36000 --quiet \
    --summary "$OUT/proxy.summary.json" 2>"$OUT/proxy.err" &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
wait_tcp_port 5061
sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.1 -p 5070 -nostdin -trace_stat -stf "$OUT/uas.csv" -fd 1 \
    >/dev/null 2>"$OUT/uas.err" &
PIDS+=($!)

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
    "$RINGWAY" sip idle --to tls:127.0.0.1:5061 --tls-ca "$OUT/ca.pem" --connections "$IDLE" \
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

csv_field() { # file column-name -> value on the last line
    awk -F';' -v col="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==col) c=i} END{print $c}' "$1"
}

# Seconds until the UAC had created all its calls (empty if it never did).
gen_secs() {
    awk -F';' -v n="$2" 'NR==1{for(i=1;i<=NF;i++){if($i=="OutgoingCall(C)")c=i; if($i=="ElapsedTime(C)")e=i}; next}
        $c+0 >= n { split($e, h, ":"); print h[1]*3600 + h[2]*60 + h[3] + (4 in h ? h[4] / 1000 : 0); exit }' "$1"
}

# SIPp's mean response time (ms) from its ResponseTime1(C) field.
rtd_ms() {
    csv_field "$1" "ResponseTime1(C)" | awk -F: 'NF >= 4 { printf "%.3f", ($1 * 3600 + $2 * 60 + $3) * 1000 + $4 / 1000; exit } { print "n/a" }'
}

printf "rate\tarm\trun\tidle_tls\tcalls\tok\tfailed\tgen_cps\tcpu_s\tcpu_us_per_call\trtd_ms\tflag\n" \
    | tee "$OUT/results.tsv"

# One run: RATE ARM RUN (the arm's connections already open or closed).
run() {
    local rate=$1 arm=$2 n=$3
    local log="$OUT/r$rate-$arm-$n" calls=$((rate * SECS))
    rm -f "$log".*
    local open c0 c1
    open=$(tls_open)
    c0=$(cpu_ticks "$PROXY_PID")
    sipp 127.0.0.1:5060 -sf "$HERE/uac_rr.xml" -s bob -key dest 127.0.0.1:5070 -i 127.0.0.1 \
        -p 5062 -m "$calls" -r "$rate" -rp 1000 -l $((rate * 4 + 100)) -d 0 \
        -timeout $((SECS * 3 + 30)) -nostdin -trace_stat -stf "$log.uac.csv" -fd 1 \
        >/dev/null 2>"$log.uac.err" &
    local uac=$!
    PIDS+=("$uac")
    wait "$uac" 2>/dev/null || true
    untrack "$uac"
    c1=$(cpu_ticks "$PROXY_PID")
    local ok failed g rtd
    ok=$(csv_field "$log.uac.csv" "SuccessfulCall(C)" 2>/dev/null || echo 0)
    failed=$(csv_field "$log.uac.csv" "FailedCall(C)" 2>/dev/null || echo 0)
    g=$(gen_secs "$log.uac.csv" "$calls" 2>/dev/null || true)
    rtd=$(rtd_ms "$log.uac.csv" 2>/dev/null || echo n/a)
    awk -v r="$rate" -v a="$arm" -v k="$n" -v o="$open" -v n="$calls" -v ok="${ok:-0}" \
        -v f="${failed:-0}" -v g="$g" -v c0="$c0" -v c1="$c1" -v tck="$TCK" -v rtd="$rtd" 'BEGIN {
            cpu = (c1 - c0) / tck; per = ok > 0 ? sprintf("%.1f", cpu * 1e6 / ok) : "n/a";
            gnum = g > 0 ? n / g : 0; gcps = g > 0 ? sprintf("%.0f", gnum) : "-";
            flag = "";
            if (f > 0 || ok < n) flag = "failed";
            else if (gnum < 0.9 * r) flag = "generator-behind";
            printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\n", r, a, k, o, n, ok, f, gcps,
                cpu, per, rtd, flag }' | tee -a "$OUT/results.tsv"
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
echo "per rate: mean CPU per call of each arm (unflagged runs), ratio idle$IDLE/idle0, noise floor"
echo "(largest (max-min)/mean of one arm's runs); capacity: highest rate with 0 failed in every run"
python3 - "$OUT/results.tsv" "$IDLE" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
idle = f"idle{sys.argv[2]}"
rates = sorted({int(r["rate"]) for r in rows})
def mean(xs):
    return sum(xs) / len(xs) if xs else None
capacity = {}
for rate in rates:
    per_arm, spreads, cps = {}, [], {}
    for arm in ("idle0", idle):
        runs = [r for r in rows if int(r["rate"]) == rate and r["arm"] == arm]
        good = [float(r["cpu_us_per_call"]) for r in runs if not r["flag"] and r["cpu_us_per_call"] != "n/a"]
        per_arm[arm] = mean(good)
        cps[arm] = mean([float(r["gen_cps"]) for r in runs if r["gen_cps"] not in ("-", "")])
        if len(good) >= 2 and mean(good):
            spreads.append((max(good) - min(good)) / mean(good))
        if runs and all(r["flag"] != "failed" for r in runs):
            capacity[arm] = rate
    a, b = per_arm["idle0"], per_arm[idle]
    ratio = f"{b / a:.3f}" if a and b else "n/a"
    floor = f"{max(spreads) * 100:.1f} %" if spreads else "n/a (REPEAT < 2)"
    fmt = lambda v: "n/a" if v is None else f"{v:.1f}"
    print(f"  {rate:>6} calls/s: idle0 {fmt(a)} us/call, {idle} {fmt(b)} us/call, "
          f"ratio {ratio}, noise floor {floor}")
for arm in ("idle0", idle):
    print(f"  capacity {arm}: " + (f"{capacity[arm]} calls/s" if arm in capacity else "n/a (no rate without failed calls)"))
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
