#!/usr/bin/env bash
# Does a flood of TLS handshakes slow UDP calls down? (issue 21: "TLS work
# stays off the UDP path"). SIPp UAC -> proxy -> SIPp UAS over UDP at RATE
# calls/s for SECONDS, with and without FLOODERS processes opening full TLS
# handshakes to the proxy's tls: listener as fast as they can, alternating,
# REPEAT times each: the spread between runs of one phase is the noise floor.
#
# Everything runs in a private network namespace with only `lo` (the script
# re-executes itself under `unshare -n`); every process is started by this
# script and stopped by PID. Not a test: timings (run on a quiet machine;
# `uptime` is printed). Certificates are made with the openssl CLI.
#
# Usage: bench/sip/tls-flood-udp.sh
#   env: RINGWAY=path (default target/release/ringway)  RATE=500  SECONDS_=10
#        REPEAT=3  FLOODERS=4  WORKERS=1  OUT=/tmp/ringway-tls-flood
# Columns: phase, run, successful, failed, mean response time (ms, SIPp's
# ResponseTime1), TLS handshakes the proxy completed, refused.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"
bench_private_netns "$@"
RINGWAY="${RINGWAY:-$ROOT/target/release/ringway}"
RATE="${RATE:-500}"
SECS="${SECONDS_:-10}"
REPEAT="${REPEAT:-3}"
FLOODERS="${FLOODERS:-4}"
WORKERS="${WORKERS:-1}"
OUT="${OUT:-/tmp/ringway-tls-flood}"
mkdir -p "$OUT"
cd "$OUT"
uptime
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=bench -keyout key.pem -out cert.pem -addext subjectAltName=IP:127.0.0.1 2>/dev/null
cat >flood.py <<'PY'
import socket, ssl, sys
ctx = ssl.create_default_context(cafile="cert.pem")
ctx.check_hostname = False
while True:
    try:
        with socket.create_connection(("127.0.0.1", 5061), timeout=5) as raw:
            with ctx.wrap_socket(raw):
                pass
    except OSError:
        pass
PY
"$RINGWAY" sip proxy --listen 127.0.0.1:5060 --listen tls:127.0.0.1:5061 \
    --tls-cert cert.pem --tls-key key.pem --relay 127.0.0.0/8 --workers "$WORKERS" \
    --quiet --summary summary.json 2>proxy.log &
PROXY=$!
PIDS+=("$PROXY")
sipp -sf "$HERE/uas_rr.xml" -i 127.0.0.1 -p 5070 -nostdin -bg >/dev/null 2>&1 || true
sleep 1
UAS=$(pgrep -n -f "sipp -sf $HERE/uas_rr.xml -i 127.0.0.1 -p 5070" || true)
[[ -n "$UAS" ]] && PIDS+=("$UAS")
printf '%-8s %3s %8s %6s %10s\n' phase run ok failed rtd_ms
for run in $(seq "$REPEAT"); do
    for phase in quiet flood; do
        FL=()
        if [[ "$phase" == flood ]]; then
            for _ in $(seq "$FLOODERS"); do
                python3 flood.py & FL+=($!); PIDS+=("$!")
            done
            sleep 1
        fi
        rm -f uac.csv
        sipp 127.0.0.1:5060 -sf "$HERE/uac_rr.xml" -s bob -key dest 127.0.0.1:5070 \
            -i 127.0.0.1 -p 5062 -r "$RATE" -m $((RATE * SECS)) -d 0 -timeout $((SECS * 3)) \
            -timeout_error -nostdin -trace_stat -fd 1 -stf uac.csv >/dev/null 2>&1 || true
        for p in "${FL[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
        python3 - "$phase" "$run" <<'PY'
import csv, sys
rows = list(csv.reader(open("uac.csv"), delimiter=";"))
head, last = rows[0], rows[-1]
get = lambda k: last[head.index(k)]
rtd = get("ResponseTime1(C)") if "ResponseTime1(C)" in head else "n/a"
try:
    parts = rtd.split(":")
    ms = (int(parts[0]) * 3600 + int(parts[1]) * 60 + int(parts[2])) * 1000 + int(parts[3]) / 1000
    rtd = f"{ms:.3f}"
except (ValueError, IndexError):
    pass
print(f"{sys.argv[1]:<8} {sys.argv[2]:>3} {get('SuccessfulCall(C)'):>8} {get('FailedCall(C)'):>6} {rtd:>10}")
PY
    done
done
kill -INT "$PROXY"
wait "$PROXY" 2>/dev/null || true
python3 -c "
import json; s = json.load(open('summary.json'))
print('proxy tls:', {k: s['tls'][k] for k in ('handshakes', 'handshakes_refused', 'handshake_failures')})
print('cpu:', s['cpu'])"
