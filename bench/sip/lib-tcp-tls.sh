# Shared by bench/sip/kamailio-tcp-tls.sh and bench/sip/idle-memory.sh
# (sourced, not run): ringway and Kamailio over TCP and TLS in a private
# network namespace, every process started here, tracked and stopped by PID.
#
# Needs: OUT (a directory), RINGWAY (the binary), ROOT (the repository),
# and bench/lib.sh sourced first (PIDS, stop_pid, cpu_ticks, wait_tcp_port).

# Kamailio with its tcp and tls modules (Debian: kamailio, kamailio-tls-modules).
need_kamailio_tls() {
    if [[ ! -e /usr/lib/x86_64-linux-gnu/kamailio/modules/tls.so ]]; then
        echo "Kamailio's tls module is missing: apt-get install kamailio-tls-modules" >&2
        echo "(scripts/install-deps.sh installs it), or PROXIES=ringway" >&2
        exit 2
    fi
}

# A test CA (ca.pem) and a certificate for 127.0.0.1 it signed (cert.pem,
# key.pem in OUT): the proxies present it, stunnel presents it on the UAS
# side; ringway and the idle client verify with the CA.
make_cert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=bench-ca -keyout "$OUT/ca.key" -out "$OUT/ca.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=bench \
        -keyout "$OUT/key.pem" -out "$OUT/cert.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' \
        >"$OUT/cert.ext"
    openssl x509 -req -in "$OUT/cert.csr" -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -CAcreateserial \
        -days 2 -extfile "$OUT/cert.ext" -out "$OUT/cert.pem" 2>/dev/null
    cat >"$OUT/kamailio-tls.cfg" <<CFG
[server:default]
method = TLSv1.2+
verify_certificate = no
require_certificate = no
private_key = $OUT/key.pem
certificate = $OUT/cert.pem

[client:default]
method = TLSv1.2+
verify_certificate = no
require_certificate = no
CFG
}

# start_proxy KIND WORKERS LOG: ringway (stateless) or Kamailio listening
# on tcp:127.0.0.1:5060 and tls:127.0.0.1:5061 (ringway also on UDP 5060,
# which it always opens); sets PROXY_PID. Bounds raised for 200 000
# connections; EXTRA_RINGWAY_ARGS adds ringway options.
start_proxy() {
    local kind=$1 workers=$2 log=$3
    case "$kind" in
    ringway)
        "$RINGWAY" sip proxy --listen 127.0.0.1:5060 --listen tcp:127.0.0.1:5060 \
            --listen tls:127.0.0.1:5061 --tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem" \
            --tls-ca "$OUT/ca.pem" --relay 127.0.0.0/8 --mode stateless \
            --workers "$workers" --tcp-threads "$workers" \
            --tcp-max-connections 200000 --tcp-max-connections-per-ip 200000 \
            --tcp-idle-timeout-s 3600 --tls-max-handshakes 1024 \
            --duration 36000 --quiet ${EXTRA_RINGWAY_ARGS:-} \
            --summary "$log.summary.json" 2>"$log.err" &
        ;;
    kamailio)
        local run="$OUT/kam-run"
        mkdir -p "$run"
        /usr/sbin/kamailio -DD -E -f "$ROOT/bench/kamailio/tcp-tls.cfg" \
            -l tcp:127.0.0.1:5060 -l tls:127.0.0.1:5061 \
            -A "TCP_CHILDREN=$workers" -A "TLS_CFG=\"$OUT/kamailio-tls.cfg\"" \
            -P "$run/kamailio.pid" -Y "$run" -m "${KAM_SHM_MB:-1024}" -M 16 \
            >"$log.out" 2>"$log.err" &
        ;;
    *)
        echo "unknown proxy $kind (ringway, kamailio)" >&2
        exit 2
        ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_tcp_port 5060
    wait_tcp_port 5061
}
