#!/usr/bin/env bash
# Cost of digest authentication: `ringway sip proxy` stateless and stateful,
# with `--auth` off and on, side by side under the same SIPp load
# (bench/sip/uac_auth.xml -> proxy -> bench/sip/uas_rr.xml). With --auth
# each call is INVITE/407/ACK, INVITE (Proxy-Authorization, MD5: Debian's
# SIPp speaks nothing else)/100/180/200, ACK, BYE/200; without it the 407
# step does not happen (the scenario skips it), so "on" carries 3 more
# messages per call and one digest verification: that is the cost measured.
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`); every process is started by this
# script, tracked by PID and stopped by PID. Not a test: timings.
#
# Usage: bench/sip/compare-auth.sh [RATES...]     (default 500 1000 2000)
#   env: RINGWAY=path (default target/release/ringway)  SECS=5  WORKERS=1
#        MODES="stateless stateful"  OUT=/tmp/ringway-auth-bench
# Columns: mode, auth, offered cps, ok, failed, proxy CPU s (utime+stime of
# the proxy process over the step, /proc/PID/stat), CPU us per successful
# call, SIPp retransmissions (UAC), proxy socket drops (summary).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
SECS="${SECS:-5}"
WORKERS="${WORKERS:-1}"
MODES="${MODES:-stateless stateful}"
OUT="${OUT:-/tmp/ringway-auth-bench}"
USERS="$ROOT/docs/ringway-users.htdigest"
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(500 1000 2000)
TCK="$(getconf CLK_TCK)"
mkdir -p "$OUT"

printf "mode\tauth\trate_cps\tok\tfailed\tproxy_cpu_s\tcpu_us_per_call\tretrans\tsocket_drops\n" | tee "$OUT/results.tsv"
for rate in "${RATES[@]}"; do
    for mode in $MODES; do
        for auth in off on; do
            log="$OUT/$mode-$auth-$rate"
            rm -f "$log".*
            sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.1 -p 5070 -nostdin -buff_size 4194304 \
                >/dev/null 2>"$log.uas.err" &
            uas=$!
            PIDS+=("$uas")
            wait_udp_port 5070
            # The UAS is on loopback: relayed to explicitly (docs/security.md).
            args=(--listen 127.0.0.1:5060 --relay 127.0.0.0/8 --mode "$mode" --workers "$WORKERS" --domain ringway.test
                --rcvbuf 4194304 --duration 3600 --quiet --summary "$log.summary.json")
            [[ $auth == on ]] && args+=(--auth --auth-file "$USERS" --auth-algorithm md5)
            "$RINGWAY" sip proxy "${args[@]}" 2>"$log.err" &
            proxy=$!
            PIDS+=("$proxy")
            wait_udp_port 5060
            sleep 0.3
            c0=$(proc_ticks "$proxy")
            timeout $((SECS * 3 + 60)) sipp 127.0.0.1:5060 -sf "$HERE/uac_auth.xml" -s bob \
                -key dest 127.0.0.1:5070 -key caller alice -key domain ringway.test \
                -au alice -ap secret -auth_uri bob@127.0.0.1:5070 -i 127.0.0.1 -p 5061 \
                -m $((rate * SECS)) -r "$rate" -l $((rate * 4 + 100)) -d 20 -buff_size 4194304 \
                -timeout $((SECS * 3 + 30)) -nostdin -trace_stat -stf "$log.uac.csv" -fd 1 \
                >/dev/null 2>"$log.uac.err" || true
            c1=$(proc_ticks "$proxy")
            kill -TERM "$proxy"; wait "$proxy" 2>/dev/null || true
            kill -TERM "$uas"; wait "$uas" 2>/dev/null || true
            ok=$(csv_field "$log.uac.csv" "SuccessfulCall(C)")
            failed=$(csv_field "$log.uac.csv" "FailedCall(C)")
            retrans=$(csv_field "$log.uac.csv" "Retransmissions(C)")
            drops=$(python3 -c "import json;print(json.load(open('$log.summary.json'))['drops']['socket_rxq_ovfl'])")
            awk -v m="$mode" -v a="$auth" -v r="$rate" -v ok="$ok" -v f="$failed" -v t=$((c1 - c0)) \
                -v tck="$TCK" -v rt="$retrans" -v d="$drops" 'BEGIN{
                cpu = t / tck; printf "%s\t%s\t%d\t%d\t%d\t%.2f\t%s\t%d\t%d\n", m, a, r, ok, f, cpu,
                (ok > 0 ? sprintf("%.1f", cpu * 1e6 / ok) : "n/a"), rt, d }' | tee -a "$OUT/results.tsv"
        done
    done
done
