#!/usr/bin/env bash
# Issue 25's quiet-machine runs, one after the other, then the Markdown
# tables for docs/pktswitch.md and docs/srpic.md:
#
#   a  ringway lab sfu --paper --netns --cpus 0 --load-cpus 1      (pktswitch Figs. 3-5)
#   b  ringway lab srpic-tcp --preset table4 --betas 0.5 --reps 20  (Table 4's collapse probability)
#   c  ringway lab srpic-tcp --tables 5 --senders A --deltas 0.1,0.01 --duration 20 --reps 5
#        --rate-mbps 100 --srpic-retransmissions sorted,tsval,in-place   ("no harm under drops":
#        the three placements as arms of the same blocks, against the same SRPIC-off runs)
#   d  the report: OUT/issue25-tables.md
#   e  ringway lab sip compare --at-rates 650 --profiles baseline,enhanced,slice-1ms
#        --proxy ringway,kamailio --workers 2,4,8 --cores 1 --batch 1 --rx-model shared
#        --reps 8 (SIP_REPS) --duration 10 --emulated-service-us exp:200   (the scheduler study at 1 core,
#        point 3: baseline vs enhanced vs a tuned slice, Kamailio alongside; OUT/sip-compare/)
#
# CLIENT_RX=xdp runs step a with `--client-io xdp` (the load clients receive and send
# through AF_XDP on their veths) into its own files (sfu-paper-xdp-clients.*).
#
# Usage (as root: the labs build network namespaces):
#   OUT=results/issue25 bench/lab/issue25-quiet.sh
#   OUT=… STEPS="b c d" bench/lab/issue25-quiet.sh     # some steps only
#   OUT=… FORCE=1 …     # start although the 1-minute load average is above MAX_LOAD (0.5)
#   OUT=… SMOKE=1 …     # tiny grids (seconds per run), validity limits off: proves the chain; not results
#
# Every lab run is appended to OUT/<step>.state.jsonl as it ends, and every
# command runs with --resume: a step that fails is retried (RETRIES, 1)
# and keeps its finished runs, and running the script again with the same
# OUT continues where it stopped. OUT/issue25.log gets one line per step
# start and end with its exit code and seconds, e.g.
#   STEP a START 2026-11-27T09:00:00Z …
#   STEP a DONE rc=0 seconds=5580
# (STEP x FAILED rc=N … when the retries are spent), and ALL DONE / ALL
# FAILED at the end, for the lead to chain on.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

OUT="${OUT:?set OUT= to the output directory}"
STEPS="${STEPS:-a b c d}"
MAX_LOAD="${MAX_LOAD:-0.5}"
RETRIES="${RETRIES:-1}"
SMOKE="${SMOKE:-0}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/issue25.log"

log() { echo "$*" | tee -a "$LOG"; }

load1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load1" -v m="$MAX_LOAD" 'BEGIN { exit !(l > m) }' && [[ "${FORCE:-0}" != 1 ]]; then
    echo "refusing to start: 1-minute load average $load1 > $MAX_LOAD (quiet-machine runs; FORCE=1 to override)" >&2
    exit 2
fi
[[ -x "$RINGWAY" ]] || { echo "no ringway binary at $RINGWAY (cargo build --release -p ringway, or RINGWAY=…)" >&2; exit 2; }

log "issue25-quiet: $(date -u +%FT%TZ) steps [$STEPS] smoke=$SMOKE out=$OUT"
log "binary $RINGWAY ($(sha256sum "$RINGWAY" | cut -c1-16)), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo n/a), kernel $(uname -r), $(nproc) CPUs"
log "load average at start: $(cat /proc/loadavg)${FORCE:+ (FORCE=$FORCE)}"

# step NAME CMD...: run CMD (output to OUT/NAME.out), retried up to RETRIES
# times (the command resumes from its state file); logs START/DONE/FAILED.
FAILED=0
step() {
    local name=$1 start rc try
    shift
    start=$(date +%s)
    log "STEP $name START $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg): $*"
    for ((try = 0; try <= RETRIES; try++)); do
        ((try > 0)) && log "STEP $name RETRY $try (resuming from its state file)"
        "$@" >>"$OUT/$name.out" 2>&1
        rc=$?
        ((rc == 0)) && break
    done
    if ((rc == 0)); then
        log "STEP $name DONE rc=0 seconds=$(($(date +%s) - start)) load $(cut -d' ' -f1-3 /proc/loadavg)"
    else
        log "STEP $name FAILED rc=$rc seconds=$(($(date +%s) - start)) (see $OUT/$name.out; run again with the same OUT to resume)"
        FAILED=1
    fi
    return 0
}

if [[ "$SMOKE" == 1 ]]; then
    # Tiny grids, and validity limits no loaded machine trips, so that the
    # statistics are exercised end to end: NOT results.
    SFU_GRID=(--clients 2,3 --pps 150 --reps 2 --duration 2 --warmup 1 --calibrate 1
        --max-foreign-cpu 1000 --max-late 100)
    T4_GRID=(--reps 2 --duration 3 --max-late-us 1000000)
    T5_GRID=(--deltas 0.1 --duration 3 --reps 2 --max-late-us 1000000)
else
    SFU_GRID=(--paper)
    T4_GRID=(--reps 20)
    T5_GRID=(--deltas 0.1,0.01 --duration 20 --reps 5)
fi
if [[ "$SMOKE" == 1 ]]; then
    SIP_GRID=(--proxy ringway --workers 2 --reps 2 --duration 2 --max-foreign-cpu 1000)
else
    SIP_GRID=(--proxy ringway,kamailio --workers 2,4,8 --reps "${SIP_REPS:-8}" --duration 10)
fi
CLIENT_RX="${CLIENT_RX:-socket}"
SFU_NAME=sfu-paper
[[ "$CLIENT_RX" == xdp ]] && SFU_NAME=sfu-paper-xdp-clients

for s in $STEPS; do
    case "$s" in
    a)
        step a "$RINGWAY" lab sfu "${SFU_GRID[@]}" --netns --cpus 0 --load-cpus 1 \
            --client-io "$CLIENT_RX" \
            --json "$OUT/$SFU_NAME.json" --svg "$OUT/$SFU_NAME.svg" --markdown "$OUT/$SFU_NAME.md" \
            --state "$OUT/$SFU_NAME.state.jsonl" --resume
        ;;
    b)
        step b "$RINGWAY" lab srpic-tcp --preset table4 --betas 0.5 "${T4_GRID[@]}" \
            --json "$OUT/t4-b05.json" --markdown "$OUT/t4-b05.md" \
            --state "$OUT/t4-b05.state.jsonl" --resume
        ;;
    c)
        step c "$RINGWAY" lab srpic-tcp --tables 5 --senders A "${T5_GRID[@]}" \
            --rate-mbps 100 --srpic-retransmissions sorted,tsval,in-place \
            --json "$OUT/t5-drops.json" --markdown "$OUT/t5-drops.md" \
            --state "$OUT/t5-drops.state.jsonl" --resume
        ;;
    d)
        step d python3 "$ROOT/bench/lab/issue25_report.py" "$OUT"
        ;;
    e)
        step e "$RINGWAY" lab sip compare --at-rates 650 --profiles baseline,enhanced,slice-1ms \
            "${SIP_GRID[@]}" --cores 1 --batch 1 --rx-model shared \
            --emulated-service-us exp:200 --out "$OUT/sip-compare"
        ;;
    *)
        log "unknown step $s (a, b, c, d, e)"
        FAILED=1
        ;;
    esac
done

if ((FAILED)); then
    log "ALL FAILED (some step failed: see the STEP lines) $(date -u +%FT%TZ)"
    exit 1
fi
log "ALL DONE $(date -u +%FT%TZ)"
