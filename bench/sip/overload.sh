#!/usr/bin/env bash
# Overload benchmark of `ringway sip proxy` (issue 19, RFC 6357/7339 in
# spirit): stateful, 2 workers on one CPU, the generator (`ringway sip
# load`, built-in UAS) on the other CPU.
#
#  1. Capacity: fresh proxy per step, RATES for CAP_SECS each (40 s by
#     default: longer than a transaction lives, timer J/L's 32 s over UDP,
#     so the step reaches the transaction table's steady state; 10 s steps
#     measured a peak the proxy did not hold for 20 s); capacity =
#     the highest goodput (successful calls/s over the start phase) of a
#     step whose generator kept its schedule (its failed calls are 503s
#     from shedding at the edge, reported in capacity.tsv).
#  2. Overload: fresh proxy, FACTOR x capacity for OVER_SECS; goodput per
#     second from the generator's progress lines (calls completed OK per
#     second, by completion time). Right after the overload's start phase
#     ends, PROBES one-second probes of PROBE_RATE calls/s start one a
#     second (separate generator processes, same CPU): the success ratio of
#     each second's calls is the recovery curve.
#  3. Capacity again (when step 1 ran and CAP_AFTER=1, the default): the
#     same steps after the overload runs, into capacity-after.tsv; the
#     summary judges each mode's goodput against the best step before,
#     the best after and the median of all valid steps — the spread of
#     the steps is the run's noise floor (this VM's speed moves by more
#     than 10 % over minutes without any steal showing) — and against the
#     best step before scaled by each second's CPU speed: cpu-speed.py
#     samples the speed of CPU 0 every 100 ms during every step and run
#     (per second of its own CPU time; ~0.5 % of the CPU).
#  Step 2 runs once per mode of MODES, side by side:
#   on   shedding (--overload-queue-delay-ms SHED_MS), generators without
#        RFC 7339 overload control (--overload-control off: no `oc` in
#        their Via, every refusal is a 503 the proxy pays for);
#   oc   shedding, generators (and probes) with RFC 7339 loss-based
#        overload control: the proxy advertises in its responses the share
#        of new calls beyond its measured capacity (OcController), the
#        generators refuse that share of their new calls themselves
#        (`throttled`, never sent);
#   off  no shedding (0, the behaviour before issue 19), no overload control.
#  Goodput and capacity are defined as in every mode: calls completed OK
#  per second against the capacity of step 1 (throttled calls are not
#  goodput; they are counted in `attempted`, so the schedule check is the
#  same).
#
# The generator's own health is reported per run (attempted/scheduled, mean
# start lag, its socket drops); a run whose generator fell behind is
# flagged (fewer than 99 % of the scheduled calls started, or a mean start
# lag over 10 ms). Other processes on the machine share the CPUs: the script
# runs in a session of its own whose scheduler autogroup gets nice NICE
# (default -5; autogroups make a plain nice count only inside a session),
# and reports how much CPU other processes still took; the noise floor is
# the spread of the capacity steps.
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`); every process is started here and
# stopped by PID. Not a test: timings.
#
# Usage: bench/sip/overload.sh
#   env: RINGWAY=path (default target/release/ringway)  OUT=/tmp/ringway-overload
#        RATES="3000 4000 5000 6000 7000 8000"  CAP_SECS=40  FACTOR=3  OVER_SECS=30
#        CAPACITY=N (skip steps 1 and 3)  CAP_AFTER=1  PROBES=10  PROBE_RATE=1000  NICE=-5
#        SHED_MS=10 (the shedding run's --overload-queue-delay-ms: the set point
#        of the admission controller, docs/sip-proxy.md)  MODES="on off"
#        (any of on, oc, off; e.g. CAPACITY=19590 MODES="on oc" PROBES=5)
#        GENS=2 (generator processes sharing the offered load, all on CPU 1:
#        one alone does not drain its socket fast enough at ~36 000 calls/s)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns --session "$@"
OUT="${OUT:-/tmp/ringway-overload}"
RATES="${RATES:-3000 4000 5000 6000 7000 8000}"
CAP_SECS="${CAP_SECS:-40}"
FACTOR="${FACTOR:-3}"
OVER_SECS="${OVER_SECS:-30}"
PROBES="${PROBES:-10}"
PROBE_RATE="${PROBE_RATE:-1000}"
NICE="${NICE:--5}"
SHED_MS="${SHED_MS:-10}"
MODES="${MODES:-on off}"
GENS="${GENS:-2}"
CAP_AFTER="${CAP_AFTER:-1}"
PROXY=127.0.0.1:5060
# With autogroups (kernel.sched_autogroup_enabled) a process's nice counts
# only inside its session; between sessions the autogroup's nice decides.
if [[ -w /proc/self/autogroup ]] && echo "$NICE" >/proc/$$/autogroup 2>/dev/null; then
    echo "this session's autogroup: $(cat /proc/$$/autogroup)"
fi
mkdir -p "$OUT"
# Nanoseconds the threads of PID waited for a CPU (run queue) so far.
run_delay() {
    cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $2 } END { printf "%.0f", s }'
}

# start_proxy LOG SHED_MS: the proxy on CPU 0 (Prometheus on 127.0.0.1:9464),
# PID in $proxy.
start_proxy() {
    # --relay: the generator's built-in UAS is an IP-literal loopback target.
    nice -n "$NICE" "$RINGWAY" sip proxy --listen "$PROXY" --relay 127.0.0.0/8 \
        --mode stateful --workers 2 \
        --rx-model shared --cpus 0 --rcvbuf 4194304 --max-transactions 4000000 \
        --max-transaction-bytes 8589934592 \
        --overload-queue-delay-ms "$2" --duration 3600 --quiet --summary "$1.proxy.json" \
        --metrics 127.0.0.1:9464 \
        2>"$1.proxy.err" &
    proxy=$!
    PIDS+=("$proxy")
    wait_udp_port 5060
    sleep 0.3
}
stop_proxy() {
    kill -TERM "$proxy"
    wait "$proxy" || true
}
# start_speed_probe LOG SECS: the CPU speed of CPU 0 (the proxy's) as it
# runs, a sample every 100 ms into LOG.speed (cpu-speed.py; PID in $speed).
start_speed_probe() {
    taskset -c 0 python3 "$HERE/cpu-speed.py" "$1.speed" "$2" &
    speed=$!
    PIDS+=("$speed")
}
stop_speed_probe() {
    kill "$speed" 2>/dev/null || true
    wait "$speed" 2>/dev/null || true
}
# load LOG RATE SECS: one generator on CPU 1 (foreground).
load() {
    nice -n "$NICE" taskset -c 1 "$RINGWAY" sip load --proxy "$PROXY" --rate "$2" \
        --calls $(($2 * $3)) --duration "$3" --arrival constant --overload-control off --json "$1.json" \
        >"$1.out" 2>"$1.err" || true
}

# capacity_steps TSV PREFIX: a fresh proxy per rate of RATES, CAP_SECS each;
# one line per step into TSV.
capacity_steps() {
    printf "rate\tattempted\tsucceeded\tfailed\tgoodput\tsched_ratio\tlag_us\tgen_rx_drops\tproxy_socket_drops\n" \
        | tee "$1"
    for rate in $RATES; do
        log="$OUT/$2-$rate"
        start_proxy "$log" "$SHED_MS"
        start_speed_probe "$log" "$CAP_SECS"
        load "$log" "$rate" "$CAP_SECS"
        stop_speed_probe
        stop_proxy
        python3 - "$log" "$rate" <<'EOF' | tee -a "$1"
import json, sys
log, rate = sys.argv[1], sys.argv[2]
l = json.load(open(log + ".json")); p = json.load(open(log + ".proxy.json"))
sched = l["attempted"] / max(l["scheduled"], 1)
print("\t".join(str(x) for x in [rate, l["attempted"], l["succeeded"], l["failed_total"],
      round(l["succeeded"] / l["start_phase_s"]), round(sched, 4), round(l["start_lag_mean_us"]),
      l["rx_dropped"], p["drops"]["socket_rxq_ovfl"]]))
EOF
    done
}
# best_step TSV: the highest goodput of a step whose generator kept its
# schedule (0: none did).
best_step() {
    python3 - "$1" <<'EOF'
import sys
best = 0
for line in open(sys.argv[1]).read().splitlines()[1:]:
    f = line.split("\t")
    att, ok, failed, goodput, sched = int(f[1]), int(f[2]), int(f[3]), int(f[4]), float(f[5])
    if att and sched >= 0.99 and float(f[6]) <= 10_000:
        best = max(best, goodput)
print(best)
EOF
}

# 1. Capacity.
measured_capacity=0
if [[ -z "${CAPACITY:-}" ]]; then
    capacity_steps "$OUT/capacity.tsv" cap
    CAPACITY=$(best_step "$OUT/capacity.tsv")
    measured_capacity=1
fi
echo "capacity: $CAPACITY calls/s" | tee "$OUT/capacity.txt"
if [[ "$CAPACITY" -le 0 ]]; then
    echo "no capacity step had a generator on schedule: machine too busy?" >&2
    exit 1
fi
OFFER=$((CAPACITY * FACTOR))

# 2. Overload, then the probes.
for mode in $MODES; do
    shed=$SHED_MS
    [[ $mode == off ]] && shed=0
    gen_oc=off
    [[ $mode == oc ]] && gen_oc=on
    log="$OUT/over-$mode"
    rm -f "$log".* "$log"-probe-*
    start_proxy "$log" "$shed"
    grep -E '^cpu[01] ' /proc/stat >"$log.stat0"
    start_speed_probe "$log" "$((OVER_SECS + PROBES + 2))"
    date +%s.%N >"$log.t0"
    run_delay "$proxy" >"$log.proxy-wait0"
    # The admission controller's fraction, scraped once a second.
    (for _ in $(seq 1 $((OVER_SECS + PROBES + 2))); do
        curl -s --max-time 0.5 http://127.0.0.1:9464/metrics 2>/dev/null \
            | awk '/^ringway_sip_overload_admitted_ratio /{ v = $2 }
                   /^ringway_sip_overload_control_reduction_percent /{ r = $2 }
                   /^ringway_sip_overload_control_capacity_calls_per_second /{ c = $2 }
                   END { print (v == "" ? "n/a" : v) "," (r == "" ? "n/a" : r) "," (c == "" ? "n/a" : c) }'
        sleep 1
    done >"$log.admitted") &
    PIDS+=("$!")
    # The proxy CPU's time split, once a second: its steal (the hypervisor)
    # and its idle per second judge each second against the CPU it had.
    (for _ in $(seq 1 $((OVER_SECS + PROBES + 2))); do
        echo "$(date +%s.%N) $(grep -E '^cpu0 ' /proc/stat)"
        sleep 1
    done >"$log.cpu0") &
    PIDS+=("$!")
    gens=()
    for g in $(seq 1 "$GENS"); do
        nice -n "$NICE" taskset -c 1 "$RINGWAY" sip load --proxy "$PROXY" \
            --rate "$((OFFER / GENS))" --calls $((OFFER / GENS * OVER_SECS)) \
            --duration "$OVER_SECS" --arrival constant --seed "$g" --overload-control "$gen_oc" \
            --json "$log.gen$g.json" >"$log.gen$g.out" 2>"$log.gen$g.err" &
        gens+=($!)
        PIDS+=("$!")
    done
    sleep "$((OVER_SECS - 1))"
    for g in "${gens[@]}"; do run_delay "$g"; echo; done >"$log.gen-wait"
    run_delay "$proxy" >"$log.proxy-wait1"
    sleep 1
    # The start phase ends about now: probes, one per second.
    probes=()
    for i in $(seq 1 "$PROBES"); do
        nice -n "$NICE" taskset -c 1 "$RINGWAY" sip load --proxy "$PROXY" --rate "$PROBE_RATE" \
            --calls "$PROBE_RATE" --duration 1 --arrival constant --quiet --overload-control "$gen_oc" \
            --json "$log-probe-$i.json" >/dev/null 2>&1 &
        probes+=($!)
        PIDS+=("$!")
        sleep 1
    done
    for g in "${gens[@]}"; do wait "$g" || true; done
    for p in "${probes[@]}"; do wait "$p" || true; done
    grep -E '^cpu[01] ' /proc/stat >"$log.stat1"
    date +%s.%N >"$log.t1"
    stop_speed_probe
    stop_proxy
    python3 - "$log" "$CAPACITY" "$OFFER" "$PROBES" "$mode" "$GENS" <<'EOF' | tee "$log.report.txt"
import json, re, sys
log, cap, offer, probes, mode, gens = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                       int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
p = json.load(open(log + ".proxy.json"))
# The generators' summaries summed (start lag: the worst mean).
ls = [json.load(open(f"{log}.gen{g}.json")) for g in range(1, gens + 1)]
l = {k: sum(x[k] for x in ls) for k in ["attempted", "scheduled", "succeeded", "failed_total", "rx_dropped"]}
l["throttled"] = sum(x.get("throttled", 0) for x in ls)
l["start_lag_mean_us"] = max(x["start_lag_mean_us"] for x in ls)
l["start_phase_s"] = max(x["start_phase_s"] for x in ls)
l["cpu"] = {"user_s": sum(x["cpu"]["user_s"] for x in ls), "sys_s": sum(x["cpu"]["sys_s"] for x in ls)}
l["failed"] = {}
for x in ls:
    for k, v in x["failed"].items():
        l["failed"][k] = l["failed"].get(k, 0) + v
# Goodput per second: each generator's progress lines (about one a
# second) give its cumulative OK count over time; interpolated linearly
# to whole seconds and summed over generators, then differenced.
def cumulative(g):
    text = open(f"{log}.gen{g}.err").read().replace("\r", "\n")
    pts = [(0.0, 0)] + [(float(m.group(1)), int(m.group(2))) for m in
           re.finditer(r"(\d+\.\d)s started \S+ \(\S+\) ok (\d+) failed", text)]
    def at(t):
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        return pts[-1][1]
    return at, pts[-1][0]
curves = [cumulative(g) for g in range(1, gens + 1)]
end = int(min(e for _, e in curves))
total = [sum(at(t) for at, _ in curves) for t in range(0, end + 1)]
series = [(t, total[t] - total[t - 1]) for t in range(1, end + 1)]
over = [g for t, g in series if 2 <= t <= l["start_phase_s"]]
sched = l["attempted"] / max(l["scheduled"], 1)
behind = sched < 0.99 or l["start_lag_mean_us"] > 10_000
over_json = {"over": over, "behind": behind}
flag = "  ** generator fell behind (or its CPU was taken): left out **" if behind else ""
print(f"mode {mode} (on: shedding; oc: shedding + RFC 7339 overload control at the generators; "
      f"off: neither): capacity {cap}/s, offered {offer}/s for {l['start_phase_s']:.1f} s "
      f"by {gens} generator processes")
print(f"  generators: attempted {l['attempted']} / scheduled {l['scheduled']} ({sched:.4f}), "
      f"mean start lag {l['start_lag_mean_us']:.0f} us, its socket drops {l['rx_dropped']}{flag}")
print(f"  calls: ok {l['succeeded']} failed {l['failed_total']} {dict(l['failed'])} "
      f"throttled by the generators (RFC 7339, never sent) {l['throttled']}")
print(f"  proxy: socket drops {p['drops']['socket_rxq_ovfl']}, queue sheds {p['proxy'].get('overload_queue_sheds')}, "
      f"table sheds {p['proxy']['overload_sheds']}, dropped on a peek {p['messages'].get('overload_queue_drops', 'n/a')} "
      f"(resends of those seen {p['messages'].get('overload_invite_resends', 'n/a')}), "
      f"transactions created {p['proxy']['transactions_created']}")
# CPU time of both CPUs over the run, and what our processes used of it:
# the rest went to other processes (the noise of a shared machine).
hz = 100
def busy(path):
    out = {}
    for line in open(path):
        f = line.split()
        v = list(map(int, f[1:]))
        out[f[0]] = (sum(v) - v[3] - v[4]) / hz
    return out
b0, b1 = busy(log + ".stat0"), busy(log + ".stat1")
wall = float(open(log + ".t1").read()) - float(open(log + ".t0").read())
proxy_cpu = p["cpu"]["process"]["user_s"] + p["cpu"]["process"]["sys_s"]
gen_cpu = l["cpu"]["user_s"] + l["cpu"]["sys_s"]
for i in range(1, probes + 1):
    try:
        q = json.load(open(f"{log}-probe-{i}.json")); gen_cpu += q["cpu"]["user_s"] + q["cpu"]["sys_s"]
    except Exception:
        pass
others0 = max((b1["cpu0"] - b0["cpu0"]) - proxy_cpu, 0)
others1 = max((b1["cpu1"] - b0["cpu1"]) - gen_cpu, 0)
print(f"  CPU over {wall:.0f} s: cpu0 busy {(b1['cpu0'] - b0['cpu0']) / wall:.0%} (proxy {proxy_cpu / wall:.0%}), "
      f"cpu1 busy {(b1['cpu1'] - b0['cpu1']) / wall:.0%} (generators {gen_cpu / wall:.0%}); "
      f"other processes ~{others0 / wall:.0%} of cpu0 and ~{others1 / wall:.0%} of cpu1 "
      f"(the proxy's CPU includes the seconds before and after)")
pw = (int(open(log + ".proxy-wait1").read() or 0) - int(open(log + ".proxy-wait0").read() or 0)) / 1e9
gw = sum(int(x) for x in open(log + ".gen-wait").read().split()) / 1e9
print(f"  run-queue wait during the overload: proxy threads {pw:.1f} s, generator threads {gw:.1f} s "
      f"(summed over threads; includes waiting for each other on the shared CPU)")
print("  goodput per second (calls completed OK):")
print("   " + " ".join(f"{g:.0f}" for t, g in series))
if over:
    low = sum(1 for g in over if g < 0.8 * cap)
    print(f"  during overload (seconds 2 .. end of start phase): min {min(over):.0f}/s "
          f"({min(over) / cap:.0%} of capacity), mean {sum(over) / len(over):.0f}/s "
          f"({sum(over) / len(over) / cap:.0%}), {low} of {len(over)} seconds under 80 %")
# Each second against the CPU the proxy's core had: the hypervisor's steal
# of cpu0 in that second (from /proc/stat, sampled once a second) takes its
# share off the capacity of that second. A second whose CPU was slower
# without steal (the VM's speed varies) still counts against the proxy.
steal = {}
try:
    rows = []
    for line in open(log + ".cpu0"):
        f = line.split()
        v = list(map(int, f[2:]))
        rows.append((float(f[0]), sum(v), v[7] if len(v) > 7 else 0))
    t_start = float(open(log + ".t0").read())
    for (ta, tot_a, st_a), (tb, tot_b, st_b) in zip(rows, rows[1:]):
        if tot_b > tot_a:
            steal[round(tb - t_start)] = (st_b - st_a) / (tot_b - tot_a)
except (OSError, ValueError):
    pass
if over and steal:
    judged = [(t, g, steal.get(t)) for t, g in series if 2 <= t <= l["start_phase_s"]]
    shares = [g / (cap * (1 - s)) for t, g, s in judged if s is not None and s < 1]
    print("  steal of cpu0 per second (%): " + " ".join(
        "n/a" if s is None else f"{100 * s:.0f}" for _, _, s in judged))
    if shares:
        low = sum(1 for x in shares if x < 0.8)
        print(f"  goodput against the capacity less that second's steal: min {min(shares):.0%}, "
              f"mean {sum(shares) / len(shares):.0%}, {low} of {len(shares)} seconds under 80 %")
# Each second against the CPU's speed in it (cpu-speed.py: a fixed unit
# of work on CPU 0 every 100 ms, per second of its own CPU time; this VM's
# CPU runs 30 % slower for seconds at a time with no steal showing),
# relative to the median speed during the capacity steps (or, without
# them, during this run).
import glob, statistics
def speeds(path):
    try:
        return [tuple(map(float, line.split())) for line in open(path)]
    except OSError:
        return []
reference = [r for f in glob.glob(log.rsplit("/", 1)[0] + "/cap-[0-9]*.speed") for _, r in speeds(f)]
own = speeds(log + ".speed")
speed_of = {}
if own:
    base = statistics.median(reference or [r for _, r in own])
    t_start = float(open(log + ".t0").read())
    per = {}
    for t, r in own:
        per.setdefault(int(t - t_start) + 1, []).append(r)
    speed_of = {t: statistics.median(v) / base for t, v in per.items()}
judged_speed = [(g, speed_of.get(t)) for t, g in series if 2 <= t <= l["start_phase_s"]]
if over and speed_of:
    print("  CPU speed of cpu0 per second (% of " + ("the capacity steps'" if reference else "this run's")
          + " median): " + " ".join("n/a" if s is None else f"{100 * s:.0f}" for _, s in judged_speed))
    shares = [g / (cap * s) for g, s in judged_speed if s]
    if shares:
        low = sum(1 for x in shares if x < 0.8)
        print(f"  goodput against the capacity times that second's CPU speed: min {min(shares):.0%}, "
              f"mean {sum(shares) / len(shares):.0%}, {low} of {len(shares)} seconds under 80 %")
over_json["speed"] = [s for _, s in judged_speed] if speed_of else None
json.dump(over_json, open(log + ".over.json", "w"))
m = p["messages"]
print(f"  admitted fraction of new INVITEs: at the end {m.get('overload_admitted_ratio')}, "
      f"lowest {m.get('overload_admitted_min_ratio')}; per second (scraped, admitted/advertised oc reduction %"
      f"/the workers' capacity estimate, calls/s):")
def fmt(x):
    a, r, c = (x.split(",") + ["", ""])[:3]
    a = a if a == "n/a" else f"{float(a):.3f}"
    if r in ("", "n/a"):
        return a
    return f"{a}/{float(r):.0f}" + ("" if c in ("", "n/a") else f"/{float(c):.0f}")
try:
    print("   " + " ".join(fmt(x) for x in open(log + ".admitted").read().split()))
except OSError:
    print("   n/a")
# The shared controller's periods (the proxy's summary), per second:
# what went into the capacity estimate and what came out.
trace = p.get("overload_control_trace") or []
if trace:
    print("  the controller's periods per second (summary's overload_control_trace): saturated/periods, "
          "queue grows, supply CPU-s/s (mean), standing ms (mean), arrived/resent/admitted calls/s (resent: INVITEs dropped unanswered coming back, not counted as arrivals), datagrams/s, "
          "sample calls per CPU-s (median), capacity and kept share at the second's end:")
    t0 = trace[0]["at_ns"]
    seconds = {}
    for r in trace:
        seconds.setdefault((r["at_ns"] - t0) // 1_000_000_000, []).append(r)
    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    def num(x, f="{:.0f}"):
        return "n/a" if x is None else f.format(x)
    for sec in sorted(seconds):
        rs = seconds[sec]
        samples = sorted(r["sample"] for r in rs if r["sample"] is not None)
        median = samples[len(samples) // 2] if samples else None
        last = rs[-1]
        print(f"   {sec:3d}: {sum(r['saturated'] for r in rs)}/{len(rs)} grows {sum(r['queue_grows'] for r in rs)} "
              f"supply {num(mean(r['supply'] for r in rs), '{:.2f}')} "
              f"standing {num(mean(r['standing_ms'] for r in rs), '{:.1f}')} "
              f"arrived {num(mean(r['arrived'] for r in rs))} resent {num(mean(r.get('resent') for r in rs))} admitted {num(mean(r['admitted'] for r in rs))} "
              f"datagrams {num(mean(r.get('datagrams') for r in rs))} "
              f"sample {num(median)} capacity {num(last['capacity'])} keep {last['keep']:.3f}")
print(f"  probes ({probes} x 1 s of calls, one a second after the overload): success ratio")
row = []
for i in range(1, probes + 1):
    try:
        q = json.load(open(f"{log}-probe-{i}.json"))
        t = q.get("throttled", 0)
        row.append(f"{q['succeeded'] / max(q['attempted'], 1):.3f}" + (f" (throttled {t})" if t else ""))
    except Exception:
        row.append("n/a")
print("   " + " ".join(row))
EOF
done

# 3. Capacity again, and each mode judged against the steps before and after.
if [[ $measured_capacity == 1 && $CAP_AFTER == 1 ]]; then
    capacity_steps "$OUT/capacity-after.tsv" cap-after
    python3 - "$OUT" "$MODES" <<'EOF' | tee "$OUT/judged.txt"
import json, sys
out, modes = sys.argv[1], sys.argv[2].split()
def steps(path):
    good = []
    for line in open(path).read().splitlines()[1:]:
        f = line.split("\t")
        if int(f[1]) and float(f[5]) >= 0.99 and float(f[6]) <= 10_000:
            good.append(int(f[4]))
    return good
before, after = steps(out + "/capacity.tsv"), steps(out + "/capacity-after.tsv")
every = sorted(before + after)
if not before or not after:
    print("capacity before or after: no step with its generator on schedule; nothing judged")
    sys.exit(0)
median = every[len(every) // 2]
refs = [("best step before", max(before)), ("best step after", max(after)), ("median step", median)]
print(f"capacity steps (goodput of the steps whose generator kept its schedule): before {before}, "
      f"after {after}; best before {max(before)}, best after {max(after)}, median {median}; "
      f"spread of all steps {min(every)}-{max(every)} ({max(every) / min(every) - 1:.0%} over the lowest): "
      f"the run's noise floor")
for mode in modes:
    try:
        o = json.load(open(f"{out}/over-{mode}.over.json"))
    except OSError:
        continue
    over = o["over"]
    if not over:
        continue
    flag = " (generator fell behind: left out)" if o["behind"] else ""
    parts = []
    for name, ref in refs:
        low = sum(1 for g in over if g < 0.8 * ref)
        parts.append(f"{name} {ref}: mean {sum(over) / len(over) / ref:.0%}, worst second "
                     f"{min(over) / ref:.0%}, {low} of {len(over)} seconds under 80 %")
    print(f"mode {mode}{flag}: " + "; ".join(parts))
    # The same against the best step before scaled by the CPU's speed: each
    # second's goodput against that step's goodput times the second's speed
    # relative to the step's own (both from cpu-speed.py, relative to the
    # median of every step before).
    speed = o.get("speed")
    if speed and any(s is not None for s in speed):
        import glob, statistics
        rows = [l.split("\t") for l in open(out + "/capacity.tsv").read().splitlines()[1:]]
        valid = [f for f in rows if int(f[1]) and float(f[5]) >= 0.99 and float(f[6]) <= 10_000]
        best = max(valid, key=lambda f: int(f[4]))
        def step_speed(rate):
            try:
                return statistics.median(float(x.split()[1]) for x in open(f"{out}/cap-{rate}.speed"))
            except (OSError, statistics.StatisticsError):
                return None
        everyone = [float(x.split()[1]) for f in glob.glob(out + "/cap-[0-9]*.speed") for x in open(f)]
        at_best = step_speed(best[0])
        if everyone and at_best:
            relative = at_best / statistics.median(everyone)
            shares = [g / (int(best[4]) * s / relative) for g, s in zip(over, speed) if s]
            low = sum(1 for x in shares if x < 0.8)
            print(f"mode {mode}{flag}, CPU speed taken into account: best step before {best[4]} "
                  f"(its CPU at {relative:.0%} of the steps' median speed): mean "
                  f"{sum(shares) / len(shares):.0%}, worst second {min(shares):.0%}, {low} of "
                  f"{len(shares)} seconds under 80 %")
EOF
fi
