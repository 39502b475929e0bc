#!/usr/bin/env bash
# Memory per idle SIP connection (issue 21), ringway and Kamailio 5.6 side
# by side: `ringway sip idle` (a light client: one thread, non-blocking
# sockets) opens N TCP or TLS connections to the proxy, each answering one
# CRLF CRLF keep-alive ping, and reads the proxy's memory before the first
# and after the last (plus SETTLE seconds). Reported: PSS summed over the
# proxy's processes (/proc/PID/smaps_rollup; Kamailio's children share its
# memory, which their RSS would count once each) and RSS (VmRSS), as the
# delta per connection; the proxy's CPU per connection set up (over TLS: per
# handshake) and connections set up per second (with the client on the
# same machine).
#
# Memory is not a timing: numbers from a loaded machine are valid, the
# CPU and rate columns are not.
#
# Everything runs in a private network namespace with only `lo` (the
# script re-executes itself under `unshare -n`); the connections come from
# SOURCES loopback addresses 127.0.0.2… (one address has about 28 000
# ports towards one server address); the file limit is raised for this
# namespace's processes only (ulimit, as root with CAP_SYS_RESOURCE; else
# up to the hard limit, and larger counts are skipped).
#
# Usage: bench/sip/idle-memory.sh
#   env: RINGWAY=path (default target/release/ringway)
#        COUNTS="10000 50000"  TRANSPORTS="tcp tls"  PROXIES="ringway kamailio"
#        WORKERS=1  SOURCES=4  PARALLEL=64  SETTLE=3  KAM_SHM_MB=4096
#        OUT=/tmp/ringway-idle-memory
# Goals (issue 21): at most 10 KiB per idle TCP and 40 KiB per idle TLS
# connection.
set -Eeuo pipefail
trap 'rc=$?; echo "idle-memory.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $rc)" >&2' ERR
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
COUNTS="${COUNTS:-10000 50000}"
TRANSPORTS="${TRANSPORTS:-tcp tls}"
PROXIES="${PROXIES:-ringway kamailio}"
WORKERS="${WORKERS:-1}"
SOURCES="${SOURCES:-4}"
PARALLEL="${PARALLEL:-64}"
SETTLE="${SETTLE:-3}"
KAM_SHM_MB="${KAM_SHM_MB:-4096}"
OUT="${OUT:-/tmp/ringway-idle-memory}"
mkdir -p "$OUT"
# shellcheck source=lib-tcp-tls.sh
source "$HERE/lib-tcp-tls.sh"
[[ " $PROXIES " == *" kamailio "* ]] && need_kamailio_tls
# As many files as the connections need (proxy and client each hold one per
# connection); without CAP_SYS_RESOURCE only up to the hard limit, and
# counts that do not fit are skipped (said in the table).
ulimit -n 250000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
FILES=$(ulimit -n)
echo "open files limit: $FILES"
make_cert
SOURCE_ARGS=()
for ((i = 0; i < SOURCES; i++)); do SOURCE_ARGS+=(--source "127.0.0.$((2 + i))"); done
uptime
printf "%-9s %-4s %7s %7s %7s %9s %9s %9s %9s %8s %s\n" proxy tr asked open failed \
    pss_B/conn rss_B/conn pss_kib rss_kib cpu_us/c opened/s
for n in $COUNTS; do
    if ((n + 200 > FILES)); then
        echo "$n connections: skipped, the open files limit is $FILES (raising it needs CAP_SYS_RESOURCE)"
        continue
    fi
    for t in $TRANSPORTS; do
        for kind in $PROXIES; do
            log="$OUT/$kind-$t-$n"
            rm -f "$log".*
            start_proxy "$kind" "$WORKERS" "$log"
            port=5060
            extra=()
            if [[ "$t" == tls ]]; then
                port=5061
                extra=(--tls-ca "$OUT/ca.pem")
            fi
            sleep 1
            "$RINGWAY" sip idle --to "$t:127.0.0.1:$port" --connections "$n" "${SOURCE_ARGS[@]}" \
                --parallel "$PARALLEL" --settle-s "$SETTLE" --server-pid "$PROXY_PID" \
                "${extra[@]}" --json "$log.json" >"$log.idle.txt" 2>&1 || true
            stop_pid "$PROXY_PID"
            PIDS=()
            python3 - "$log.json" "$kind" "$t" <<'PY'
import json, sys
path, kind, t = sys.argv[1:]
try:
    s = json.load(open(path))
except (OSError, ValueError):
    print(f"{kind:<9} {t:<4} (no summary: see {path[:-5]}.idle.txt)")
    sys.exit(0)
srv = s.get("server") or {}
fmt = lambda v, f="{:.0f}": "n/a" if v is None else f.format(v)
failed = sum(s["failed"].values())
print(f"{kind:<9} {t:<4} {s['connections']:>7} {s['open']:>7} {failed:>7} "
      f"{fmt(srv.get('pss_per_connection_bytes')):>9} {fmt(srv.get('rss_per_connection_bytes')):>9} "
      f"{srv.get('open', {}).get('pss_kib', 'n/a'):>9} {srv.get('open', {}).get('rss_kib', 'n/a'):>9} "
      f"{fmt(srv.get('cpu_us_per_connection'), '{:.1f}'):>8} {s['opened_per_s']:.0f}"
      + ("" if failed == 0 else f"   failed: {s['failed']} {s['first_errors']}"))
PY
        done
    done
done
