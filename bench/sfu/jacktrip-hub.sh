#!/usr/bin/env bash
# Benchmark (not a test): JackTrip's own hub server (`jacktrip -S -p 2`,
# on a jackd dummy server) against ringway's hub (`ringway sfu jacktrip`),
# side by side in one run, with the same real `jacktrip -C` clients.
#
#   sudo bench/sfu/jacktrip-hub.sh [OUT_DIR]
#   CLIENTS="2 4 8" FRAMES="64 128" SECONDS_MEASURED=8 sudo -E bench/sfu/jacktrip-hub.sh
#   HUBS="jacktrip ringway ringway-clocked"   (the default; ringway-clocked
#   is `ringway sfu jacktrip --clocked`: one wake per packet period)
#
# Setup: two network namespaces made here (hub, clients) joined by a veth
# pair (10.77.0.1 hub, 10.77.0.2 clients); nothing leaves them. Each client
# is `jacktrip -C` on a `jackd -d dummy -r 48000 -p FRAMES` (client i on
# server i mod JACKDS, 4: JACK allows 8 servers per machine); client 0
# plays a metronome (jack_metro, 10 beats/s, 20 ms bursts), the others send
# silence, so every beat's onset can be seen going in and coming out.
#
# Measured per run, over SECONDS_MEASURED after a settling time:
# - CPU per client: utime+stime of the hub process(es) from /proc/PID/stat,
#   over the window, divided by the clients. For JackTrip's hub it is given
#   for `jacktrip -S` alone and with the hub's own jackd (which does its
#   mixing); ringway's hub is one process.
# - Delay added at the hub, per beat, on one clock: tcpdump on the hub's
#   veth (kernel stamps). For each beat, the onset's time in the packet
#   that brought it (packet stamp minus the frames after the onset) is
#   subtracted from the same onset's time in each packet that took it to
#   another client. JackTrip's header and 16-bit samples are parsed; the
#   hubs re-frame differently, so sample-accurate onset times are used.
#
# VETH_NAPI=threaded: GRO on both veth ends (veth then receives through
# NAPI) and threaded NAPI, so the receive path of a datagram runs in a NAPI
# kernel thread instead of in the sender's system call. Without it (the
# default), a hub's sendto over veth also pays the client's whole receive
# path and its wakeup, which on a real network happens on the client's
# machine; the hubs' CPU is then mostly that (see docs/sfu.md).
#
# Everything started here is stopped by PID; the namespaces are deleted on
# exit (also on error or Ctrl-C).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../lib.sh
source "$ROOT/bench/lib.sh"
RINGWAY=${RINGWAY:-$ROOT/target/release/ringway}
OUT=${1:-$(mktemp -d /tmp/rw-jthub.XXXXXX)}
CLIENTS=${CLIENTS:-"2 4 8"}
FRAMES=${FRAMES:-"64 128"}
HUBS=${HUBS:-"jacktrip ringway ringway-clocked"}
SECONDS_MEASURED=${SECONDS_MEASURED:-8}
SETTLE=${SETTLE:-4}
VETH_NAPI=${VETH_NAPI:-}
# Client jackd servers: JACK allows 8 servers per machine (the hub's
# jackd is one), so client i runs on server i mod JACKDS.
JACKDS=${JACKDS:-4}
NS_HUB=rwjh-hub-$$
NS_CLI=rwjh-cli-$$
mkdir -p "$OUT"
tools=(jacktrip jackd jack_metro jack_connect tcpdump python3)
[ "$VETH_NAPI" = threaded ] && tools+=(ethtool)
for t in "${tools[@]}"; do
    command -v "$t" >/dev/null || { echo "missing $t (scripts/install-deps.sh)" >&2; exit 2; }
done
[ -x "$RINGWAY" ] || { echo "build first: cargo build --release -p ringway" >&2; exit 2; }

cleanup() {
    stop_pids
    ip netns del "$NS_HUB" 2>/dev/null || true
    ip netns del "$NS_CLI" 2>/dev/null || true
}
trap cleanup EXIT
# On INT/TERM: clean up and stop (a trap that only cleaned up would go on
# to the next configuration without its namespaces).
trap 'cleanup; exit 130' INT TERM

ip netns add "$NS_HUB"
ip netns add "$NS_CLI"
ip link add rwjh-h$$ netns "$NS_HUB" type veth peer name rwjh-c$$ netns "$NS_CLI"
ip -n "$NS_HUB" addr add 10.77.0.1/24 dev rwjh-h$$
ip -n "$NS_CLI" addr add 10.77.0.2/24 dev rwjh-c$$
for ns in "$NS_HUB" "$NS_CLI"; do
    ip -n "$ns" link set lo up
done
ip -n "$NS_HUB" link set rwjh-h$$ up
ip -n "$NS_CLI" link set rwjh-c$$ up
if [ "$VETH_NAPI" = threaded ]; then
    ip netns exec "$NS_HUB" ethtool -K rwjh-h$$ gro on
    ip netns exec "$NS_CLI" ethtool -K rwjh-c$$ gro on
    ip netns exec "$NS_HUB" sh -c "echo 1 > /sys/class/net/rwjh-h$$/threaded"
    ip netns exec "$NS_CLI" sh -c "echo 1 > /sys/class/net/rwjh-c$$/threaded"
fi

# ticks of a process (utime + stime, fields 14 and 15 of /proc/PID/stat)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
bg() { # bg NS LOG cmd... : start in a namespace, remember the PID
    local ns=$1 log=$2; shift 2
    ip netns exec "$ns" "$@" >"$log" 2>&1 &
    PIDS+=($!)
    LAST=$!
}

run_one() { # hub n frames
    local hub=$1 n=$2 frames=$3 dir="$OUT/$1-n$2-f$3"
    mkdir -p "$dir"
    local hubpids=()
    if [ "$hub" = jacktrip ]; then
        bg "$NS_HUB" "$dir/hub-jackd.log" env JACK_DEFAULT_SERVER=rwjh-hub$$ \
            jackd -n rwjh-hub$$ -d dummy -r 48000 -p "$frames"
        hubpids+=("$LAST")
        sleep 1.5
        bg "$NS_HUB" "$dir/hub.log" env JACK_DEFAULT_SERVER=rwjh-hub$$ \
            jacktrip -S -p 2 -B 4464 -U 61002
        hubpids=("$LAST" "${hubpids[@]}")
    else
        local extra=()
        [ "$hub" = ringway-clocked ] && extra=(--clocked)
        bg "$NS_HUB" "$dir/hub.log" "$RINGWAY" sfu jacktrip --listen 10.77.0.1:4464 \
            --udp-port 61002 --json "$dir/hub.json" "${extra[@]}"
        hubpids+=("$LAST")
    fi
    sleep 1
    local i
    local m=$((n < JACKDS ? n : JACKDS))
    for ((i = 0; i < m; i++)); do
        bg "$NS_CLI" "$dir/jackd$i.log" env JACK_DEFAULT_SERVER=rwjh$$-$i \
            jackd -n rwjh$$-$i -d dummy -r 48000 -p "$frames"
    done
    sleep 2
    for ((i = 0; i < n; i++)); do
        bg "$NS_CLI" "$dir/jacktrip$i.log" env JACK_DEFAULT_SERVER=rwjh$$-$((i % m)) \
            jacktrip -C 10.77.0.1 -B $((5001 + i)) -n 1 -J c$i -K c$i -D
    done
    sleep 3
    bg "$NS_CLI" "$dir/metro.log" env JACK_DEFAULT_SERVER=rwjh$$-0 \
        jack_metro -f 1000 -A 0.5 -b 600 -D 20 -n metro
    sleep 0.5
    ip netns exec "$NS_CLI" env JACK_DEFAULT_SERVER=rwjh$$-0 \
        jack_connect metro:600_bpm c0:send_1 || echo "jack_connect failed" >"$dir/FAILED"
    sleep "$SETTLE"
    bg "$NS_HUB" "$dir/tcpdump.log" tcpdump -i rwjh-h$$ -B 16384 -s 512 -w "$dir/hub.pcap" udp
    local tcpdump_pid=$LAST
    sleep 1
    local t0 t1 p
    t0=()
    for p in "${hubpids[@]}"; do t0+=("$(ticks "$p")"); done
    local clk0 clk1
    clk0=$(date +%s.%N)
    sleep "$SECONDS_MEASURED"
    clk1=$(date +%s.%N)
    t1=()
    for p in "${hubpids[@]}"; do t1+=("$(ticks "$p")"); done
    kill -INT "$tcpdump_pid" 2>/dev/null || true
    sleep 1
    # CPU per client, % of one core: ticks / CLK_TCK / wall / clients
    local hz
    hz=$(getconf CLK_TCK)
    {
        echo "hub=$hub clients=$n frames=$frames wall_s=$(echo "$clk1 - $clk0" | bc)"
        for k in "${!hubpids[@]}"; do
            echo "proc$k ticks=$((t1[k] - t0[k])) hz=$hz"
        done
        uptime
    } >"$dir/cpu.txt"
    stop_pids
    sleep 1
}

for frames in $FRAMES; do
    for n in $CLIENTS; do
        for hub in $HUBS; do
            echo "== $hub: $n clients, $frames frames" >&2
            run_one "$hub" "$n" "$frames"
        done
    done
done

python3 "$ROOT/bench/sfu/jacktrip_hub_report.py" "$OUT" | tee "$OUT/report.md"
echo "raw data: $OUT" >&2
