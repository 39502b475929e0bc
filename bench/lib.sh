# What the benchmark scripts under bench/ share (sourced, not run; bash,
# after the caller's `set -euo pipefail`): a private network namespace,
# every process tracked and stopped by PID, CPU time from /proc, waiting
# for a port, SIPp statistics.
#
# Sourcing it defines PIDS=() and an EXIT trap that stops them
# (`stop_pids`); a script that has more to clean up sets its own trap and
# calls `stop_pids` from it.

# bench_private_netns [--session] "$@": re-execute the calling script in a
# private network namespace with only `lo` (brought up), unless it runs in
# one already. `--session`: in a session of its own too (`setsid -w`: its
# own scheduler autogroup, which ends with it).
bench_private_netns() {
    local session=()
    if [[ "${1:-}" == --session ]]; then
        session=(setsid -w)
        shift
    fi
    if [[ "${RINGWAY_BENCH_NETNS:-}" != "1" ]]; then
        exec env RINGWAY_BENCH_NETNS=1 unshare -n -- "${session[@]}" bash "$0" "$@"
    fi
    ip link set lo up
}

# The processes this script started (add each one's PID).
PIDS=()

# Stop every process in PIDS: TERM, half a second to exit, then KILL; reap
# them.
stop_pids() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    PIDS=()
}
trap stop_pids EXIT

# stop_pid PID: TERM, up to 10 s to exit, then KILL; reaped.
stop_pid() {
    local p=$1 i
    kill -TERM "$p" 2>/dev/null || true
    for i in $(seq 1 100); do
        kill -0 "$p" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}

# proc_ticks PID: utime+stime ticks of one process (CLK_TCK per second).
proc_ticks() {
    awk '{ line = $0; sub(/^.*\) /, "", line); split(line, f, " "); print f[12] + f[13] }' "/proc/$1/stat"
}

# cpu_ticks PID: utime+stime ticks of a process and all its descendants
# (Kamailio forks children). Reads every /proc/<pid>/stat once: field 4 is
# the parent pid.
cpu_ticks() {
    # A process can exit between the glob and the read: cat then fails,
    # which pipefail would turn into a silent exit; the rest is still read.
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" '{
        line = $0; sub(/^.*\) /, "", line); split(line, f, " ");
        pid = $1; ppid[pid] = f[2]; ticks[pid] = f[12] + f[13] }
        END {
            keep[root] = 1; changed = 1;
            while (changed) { changed = 0;
                for (p in ppid) if (!(p in keep) && (ppid[p] in keep)) { keep[p] = 1; changed = 1 } }
            t = 0; for (p in keep) t += ticks[p]; print t }'
}

# wait_port udp|tcp PORT TRIES: until something listens on PORT here
# (TRIES looks 50 ms apart).
wait_port() {
    local i flags=-Huln what="port"
    [[ $1 == tcp ]] && flags=-Htln what="TCP port"
    for i in $(seq 1 "$3"); do
        ss "$flags" "sport = :$2" | grep -q . && return 0
        sleep 0.05
    done
    echo "$what $2 never opened" >&2
    return 1
}
wait_udp_port() { wait_port udp "$1" 100; }
wait_tcp_port() { wait_port tcp "$1" 200; }

# csv_field FILE COLUMN: COLUMN's value on the last line of a SIPp
# statistics file (`;`-separated, names on the first line).
csv_field() {
    awk -F';' -v col="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==col) c=i} END{print $c}' "$1"
}

# gen_secs FILE CALLS: seconds until a SIPp UAC had created CALLS calls
# (the first statistics line whose OutgoingCall(C) reaches it); empty if
# it never did.
gen_secs() {
    awk -F';' -v n="$2" 'NR==1{for(i=1;i<=NF;i++){if($i=="OutgoingCall(C)")c=i; if($i=="ElapsedTime(C)")e=i}; next}
        $c+0 >= n { split($e, h, ":"); print h[1]*3600 + h[2]*60 + h[3] + (4 in h ? h[4] / 1000 : 0); exit }' "$1"
}
