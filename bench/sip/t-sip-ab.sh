#!/usr/bin/env bash
# T_sip of two builds side by side (issue 23): the t_sip benchmark
# (crates/ringway-sip/benches/t_sip.rs) built against build A and build B,
# run alternately A B B A (REPEAT times), on one CPU if CPU is set. The
# spread between the runs of one build is the noise floor; the ratio B/A
# of the means is the effect.
#
# Building the two binaries (the harness uses only the public API, so the
# same bench file builds against an older tree):
#   cargo bench -p ringway-sip --bench t_sip --no-run   # prints the binary
#   cp target/release/deps/t_sip-<hash> /tmp/t_sip-B
#   git checkout A -- crates/ringway-sip/src && cargo bench … --no-run && cp … /tmp/t_sip-A
#   git checkout HEAD -- crates/ringway-sip/src
#
# Usage: bench/sip/t-sip-ab.sh A_BIN B_BIN
#   env: REPEAT=2 (A B B A per repeat)  CALLS=5000  ROUNDS=5  MODE=stateless
#        CPU= (taskset CPU, none by default)  OUT=/tmp/ringway-t-sip-ab
# Prints per run the p50 of all call messages and of each message type
# (ns), then per column: mean A, mean B, B/A, and the noise floor (the
# largest relative difference between two runs of the same build). Not a
# test: timings; on a shared machine only the ratios mean anything.
set -euo pipefail
A="${1:?usage: t-sip-ab.sh A_BIN B_BIN}"
B="${2:?usage: t-sip-ab.sh A_BIN B_BIN}"
REPEAT="${REPEAT:-2}"
OUT="${OUT:-/tmp/ringway-t-sip-ab}"
mkdir -p "$OUT"
pin=()
[[ -n "${CPU:-}" ]] && pin=(taskset -c "$CPU")
export CALLS="${CALLS:-5000}" ROUNDS="${ROUNDS:-5}" MODE="${MODE:-stateless}" PARSE_ALONE=0

# One run: "all INVITE 180 200 ACK BYE 200-BYE" p50s.
run() {
    local bin="$1" log="$2"
    "${pin[@]}" "$bin" --bench >"$log" 2>&1
    local all kinds
    all=$(sed -n 's/^all call messages: p50 \([0-9]*\) ns.*/\1/p' "$log")
    kinds=$(awk '$1 ~ /^(INVITE|180|200|ACK|BYE|200-BYE)$/ {printf " %s", $2}' "$log")
    echo "$all$kinds"
}

printf "run\tbuild\tall\tINVITE\t180\t200\tACK\tBYE\t200-BYE\n" | tee "$OUT/runs.tsv"
n=0
for rep in $(seq 1 "$REPEAT"); do
    for build in A B B A; do
        n=$((n + 1))
        bin="$A"
        [[ $build == B ]] && bin="$B"
        row=$(run "$bin" "$OUT/run-$n-$build.log")
        printf "%s\t%s\t%s\n" "$n" "$build" "$(echo "$row" | tr ' ' '\t')" | tee -a "$OUT/runs.tsv"
    done
done

awk -F'\t' 'NR > 1 {
    for (c = 3; c <= NF; c++) {
        k = $2 SUBSEP c
        sum[k] += $c; cnt[k]++
        if (!(k in lo) || $c < lo[k]) lo[k] = $c
        if (!(k in hi) || $c > hi[k]) hi[k] = $c
    }
    ncol = NF
}
END {
    split("all INVITE 180 200 ACK BYE 200-BYE", name, " ")
    printf "%-8s %9s %9s %7s %7s\n", "p50 of", "mean A", "mean B", "B/A", "noise"
    for (c = 3; c <= ncol; c++) {
        a = sum["A" SUBSEP c] / cnt["A" SUBSEP c]
        b = sum["B" SUBSEP c] / cnt["B" SUBSEP c]
        na = (hi["A" SUBSEP c] - lo["A" SUBSEP c]) / a
        nb = (hi["B" SUBSEP c] - lo["B" SUBSEP c]) / b
        printf "%-8s %9.0f %9.0f %7.3f %6.1f%%\n", name[c - 2], a, b, b / a, 100 * (na > nb ? na : nb)
    }
}' "$OUT/runs.tsv" | tee "$OUT/summary.txt"
