#!/usr/bin/env bash
# The SIP proxy on the same wire three ways: `ringway sip proxy --backend
# mmsg`, `--backend xdp --interface prx0` (AF_XDP, native XDP on veth) and
# Kamailio (stateless forward), one worker / one UDP child each, under the
# same SIPp load (bench/sip/uac_rr.xml -> proxy -> bench/sip/uas_rr.xml).
#
# Testbed: two network namespaces this script creates and deletes
# (rw-<pid>-bgen, rw-<pid>-bprx) joined by one veth pair, 10.78.0.1/24
# (SIPp UAC and UAS) and 10.78.0.2/24 (the proxy). No other traffic leaves
# them. Transmit checksum offload is turned off on the generator's veth
# (a same-host veth sender leaves UDP checksums partial; the xdp backend
# verifies every checksum and would drop them). Every process is started by
# this script, tracked by PID and killed by PID; the namespaces are deleted
# on exit (also on failure).
#
# Usage: bench/sip/xdp-vs-mmsg.sh [RATES...]        (needs root)
#   env: RINGWAY=path/to/ringway (default: target/release/ringway)
#        PROXIES="mmsg xdp kamailio"
#        MODE=stateless   (or stateful; Kamailio is always stateless)
#        SECS=10          seconds of load per step
#        PAUSE_MS=20      call hold time
#        PROXY_CPUS=0 GEN_CPUS=1   (taskset lists; empty: no pinning)
#        OUT=/tmp/ringway-sip-xdp  (results.tsv and per-run logs)
# Reports per step: calls, failed, generated rate (gen_cps; a step whose
# SIPp fell below 90 % of the offered rate is flagged gen_behind and left
# out of the capacity), proxy CPU seconds and µs per successful call
# (utime+stime of the proxy and its children from /proc, delta over the
# step), and SIPp's CPU (UAC + UAS) beside it, to tell whether the proxy
# or the generator is the limit. Run it on a quiet machine (`uptime`):
# absolute numbers on a shared VM are noise; compare the rows of one run.
set -Eeuo pipefail
trap 'rc=$?; echo "xdp-vs-mmsg.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
PROXIES="${PROXIES:-mmsg xdp kamailio}"
MODE="${MODE:-stateless}"
SECS="${SECS:-10}"
PAUSE_MS="${PAUSE_MS:-20}"
PROXY_CPUS="${PROXY_CPUS-0}"
GEN_CPUS="${GEN_CPUS-1}"
OUT="${OUT:-/tmp/ringway-sip-xdp}"
KAMCFG="${KAMCFG:-$ROOT/bench/kamailio/stateless.cfg}"
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(1000 2000 4000 6000 8000)
TCK="$(getconf CLK_TCK)"
NSG="rw-$$-bgen"
NSP="rw-$$-bprx"
GEN_IP=10.78.0.1
PRX_IP=10.78.0.2
[[ "$(id -u)" == 0 ]] || { echo "xdp-vs-mmsg.sh: needs root (namespaces, XDP)" >&2; exit 2; }
[[ -x "$RINGWAY" ]] || { echo "xdp-vs-mmsg.sh: no $RINGWAY (cargo build --release -p ringway)" >&2; exit 2; }

mkdir -p "$OUT"
cleanup() {
    stop_pids
    ip netns del "$NSG" 2>/dev/null || true
    ip netns del "$NSP" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$NSG"
ip netns add "$NSP"
ip link add gen0 netns "$NSG" type veth peer name prx0 netns "$NSP"
ip -n "$NSG" addr add "$GEN_IP/24" dev gen0
ip -n "$NSP" addr add "$PRX_IP/24" dev prx0
for ns in "$NSG" "$NSP"; do
    ip -n "$ns" link set lo up
done
ip -n "$NSG" link set gen0 up
ip -n "$NSP" link set prx0 up
ip netns exec "$NSG" ethtool -K gen0 tx off >/dev/null

# Command prefixes (arrays, not functions: a background function would be
# a subshell, and $! its PID instead of the program's).
IN_GEN=(ip netns exec "$NSG")
[[ -n "$GEN_CPUS" ]] && IN_GEN+=(taskset -c "$GEN_CPUS")
IN_PRX=(ip netns exec "$NSP")
[[ -n "$PROXY_CPUS" ]] && IN_PRX+=(taskset -c "$PROXY_CPUS")

# utime+stime ticks of a process and its descendants, with the CPU time of
# the children they waited for (bench/lib.sh's cpu_ticks leaves that out).
tree_ticks() {
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" '{
        line = $0; sub(/^.*\) /, "", line); split(line, f, " ");
        pid = $1; ppid[pid] = f[2]; ticks[pid] = f[12] + f[13] + f[14] + f[15] }
        END {
            keep[root] = 1; changed = 1;
            while (changed) { changed = 0;
                for (p in ppid) if (!(p in keep) && (ppid[p] in keep)) { keep[p] = 1; changed = 1 } }
            t = 0; for (p in keep) t += ticks[p]; print t }'
}

wait_udp_port() { # namespace port
    local i
    for i in $(seq 1 100); do
        if ip netns exec "$1" ss -Huln "sport = :$2" | grep -q .; then return 0; fi
        sleep 0.05
    done
    echo "port $2 never opened in $1" >&2
    return 1
}

start_proxy() { # kind log
    case "$1" in
    mmsg | xdp)
        local xdp=()
        [[ "$1" == xdp ]] && xdp=(--interface prx0)
        "${IN_PRX[@]}" "$RINGWAY" sip proxy --listen "$PRX_IP:5060" --relay 10.78.0.0/24 --mode "$MODE" \
            --workers 1 --backend "$1" "${xdp[@]}" --duration 3600 --quiet \
            --summary "$2.summary.json" 2>"$2.err" &
        ;;
    kamailio)
        local run="$OUT/kam-run"
        mkdir -p "$run"
        "${IN_PRX[@]}" /usr/sbin/kamailio -DD -E -f "$KAMCFG" -l "udp:$PRX_IP:5060" -n 1 \
            -P "$run/kamailio.pid" -Y "$run" -m 64 -M 8 >"$2.out" 2>"$2.err" &
        ;;
    *)
        echo "unknown proxy $1 (mmsg, xdp, kamailio)" >&2
        return 2
        ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_udp_port "$NSP" 5060
}

printf "proxy\tmode\trate_cps\tcalls\tok\tfailed\tgen_cps\tflag\tproxy_cpu_s\tproxy_us_per_call\tsipp_cpu_s\tbackend_as_run\n" >"$OUT/results.tsv"
echo "results: $OUT/results.tsv  (veth testbed $NSG <-> $NSP; CLK_TCK=$TCK)"
for kind in $PROXIES; do
    for rate in "${RATES[@]}"; do
        log="$OUT/$kind-$MODE-$rate"
        rm -f "$log".*
        "${IN_GEN[@]}" sipp -sf "$HERE/uas_rr.xml" -i "$GEN_IP" -p 5070 -nostdin -max_socket 4096 \
            -trace_stat -stf "$log.uas.csv" -fd 1 >/dev/null 2>"$log.uas.err" &
        UAS_PID=$!
        PIDS+=("$UAS_PID")
        wait_udp_port "$NSG" 5070
        start_proxy "$kind" "$log"
        # Kamailio binds its port before its UDP child is ready.
        if [[ "$kind" == kamailio ]]; then sleep 2; else sleep 0.5; fi
        calls=$((rate * SECS))
        c0=$(tree_ticks "$PROXY_PID")
        u0=$(tree_ticks "$UAS_PID")
        lim=$((rate * 4 + 100))
        "${IN_GEN[@]}" timeout $((SECS * 3 + 60)) sipp "$PRX_IP:5060" -sf "$HERE/uac_rr.xml" -s bob \
            -key dest "$GEN_IP:5070" -i "$GEN_IP" -p 5061 -m "$calls" -r "$rate" -rp 1000 \
            -l "$lim" -d "$PAUSE_MS" -timeout $((SECS * 3 + 30)) -nostdin \
            -trace_stat -stf "$log.uac.csv" -fd 1 >/dev/null 2>"$log.uac.err" &
        UAC_PID=$!
        PIDS+=("$UAC_PID")
        uac_ticks=0
        while kill -0 "$UAC_PID" 2>/dev/null; do
            v=$(tree_ticks "$UAC_PID")
            ((v > uac_ticks)) && uac_ticks=$v
            sleep 0.2
        done
        wait "$UAC_PID" 2>/dev/null || true
        c1=$(tree_ticks "$PROXY_PID")
        u1=$(tree_ticks "$UAS_PID")
        kill -INT "$PROXY_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
        stop_pids
        ok=$(csv_field "$log.uac.csv" "SuccessfulCall(C)")
        failed=$(csv_field "$log.uac.csv" "FailedCall(C)")
        g=$(gen_secs "$log.uac.csv" "$calls" || true)
        backend=$kind
        if [[ -s "$log.summary.json" ]]; then
            backend=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["config"]; print(c["backend"] + ("(fallback)" if c.get("backend_fallback") else ""))' "$log.summary.json")
        fi
        read -r gen flag cpu per scpu < <(awk -v ok="$ok" -v n="$calls" -v g="${g:-0}" -v r="$rate" \
            -v c0="$c0" -v c1="$c1" -v u0="$u0" -v u1="$u1" -v ua="$uac_ticks" -v tck="$TCK" 'BEGIN{
                gen = g > 0 ? n / g : 0; flag = (gen >= 0.9 * r) ? "ok" : "gen_behind";
                cpu = (c1 - c0) / tck; per = ok > 0 ? cpu * 1e6 / ok : 0;
                printf "%.1f %s %.3f %.1f %.3f\n", gen, flag, cpu, per, (u1 - u0 + ua) / tck }')
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$kind" "$MODE" "$rate" "$calls" \
            "$ok" "$failed" "$gen" "$flag" "$cpu" "$per" "$scpu" "$backend" | tee -a "$OUT/results.tsv"
    done
done

echo
echo "capacity (highest offered rate with <1% failed-or-missing calls and SIPp at >= 90% of it)"
echo "and the proxy's CPU per call there; ratios to kamailio from the same run:"
awk -F'\t' 'NR>1 && $8 == "ok" && ($4 - $5) < 0.01 * $4 { if ($3 > cap[$1]) { cap[$1] = $3; cpc[$1] = $10 } }
    END { for (k in cap) printf "  %-9s %6d cps   %.1f us/call\n", k, cap[k], cpc[k];
          if ("kamailio" in cap) for (k in cap) if (k != "kamailio")
              printf "  %s/kamailio: capacity %.2fx, CPU per call %.2fx (at each one'"'"'s capacity)\n",
                  k, cap[k] / cap["kamailio"], cpc[k] / cpc["kamailio"] }' "$OUT/results.tsv"
echo "per-rate CPU per call side by side (same offered rate, all three carried it):"
awk -F'\t' 'NR>1 && $8 == "ok" && ($4 - $5) < 0.01 * $4 { per[$3 "," $1] = $10; rates[$3] = 1 }
    END { for (r in rates) if (((r ",kamailio") in per)) for (k in per) { split(k, a, ",");
              if (a[1] == r && a[2] != "kamailio")
                  printf "  %6d cps  %-5s %.1f us/call = %.2fx kamailio\n", r, a[2], per[k], per[k] / per[r ",kamailio"] } }' \
    "$OUT/results.tsv"
