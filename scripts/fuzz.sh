#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ for a bounded time, on the
# stable toolchain: cargo-fuzz builds the targets with SanitizerCoverage
# (`--sanitizer none`: AddressSanitizer needs nightly) and libFuzzer runs them.
#
#   scripts/fuzz.sh                 each target for its CI budget (below)
#   FUZZ_SECONDS=600 scripts/fuzz.sh sip_proxy pcap    longer, chosen targets
#   scripts/fuzz.sh --merge [T...]  also add the new inputs that raise
#                                   coverage to fuzz/corpus/ (to commit)
#
# New inputs go to target/fuzz-corpus/<target>/ (the committed corpus is
# read, not written, unless --merge). A crash, a hang (> 10 s per input) or
# an out-of-memory (> 2 GiB) fails the run; the reproducer is written to
# fuzz/artifacts/<target>/ and printed in base64, to be minimised
# (`cargo fuzz tmin --sanitizer none -a -O --features libfuzzer T FILE`) and
# committed to fuzz/corpus/<target>/ with the fix. Exits non-zero when any
# target failed, or when a corpus is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

merge=false
if [ "${1:-}" = "--merge" ]; then
  merge=true
  shift
fi

# Seconds per target in CI (about 6.5 minutes in all): the cores and the
# parsers with most structure get more.
declare -A BUDGET=(
  [sip_parse]=50 [sip_proxy]=60 [sip_dispatch]=40 [sip_digest]=25
  [sfu_wire]=20 [sfu_core]=45 [sfu_jacktrip]=20 [sfu_token]=15 [sfu_recording]=15
  [pcap]=45 [nfqueue]=20 [rtnetlink]=15 [xdp_frame]=15
  [redis_reply]=30 [metrics_http]=10 [sip_tcp_framing]=20 [dns_response]=20 [sip_ws]=20 [sip_ws_client]=15
)
declare -A DICT=([sip_parse]=sip [sip_proxy]=sip [sip_dispatch]=sip [sip_digest]=sip)

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
fi
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets found" >&2; exit 1; }

flags=(--fuzz-dir fuzz --sanitizer none --debug-assertions --release --features libfuzzer)
# Keep short constant-size comparisons (`s == "/metrics"`) as memcmp/bcmp
# calls, which libFuzzer intercepts to learn the bytes compared against;
# LLVM otherwise expands them into XORed loads that give it no hint (a
# planted 6-byte string was found in 1 s with this, not in 120 s without).
export RUSTFLAGS="${RUSTFLAGS:-} -Cllvm-args=-max-loads-per-memcmp=0"
start=$(date +%s)
cargo fuzz build "${flags[@]}"
echo "fuzz: targets built in $(( $(date +%s) - start )) s"
bin=target/x86_64-unknown-linux-gnu/release

failed=()
for t in "${targets[@]}"; do
  corpus=fuzz/corpus/$t
  if [ -z "$(ls -A "$corpus" 2>/dev/null)" ]; then
    echo "fuzz: $t: corpus $corpus is missing or empty" >&2
    failed+=("$t")
    continue
  fi
  secs=${FUZZ_SECONDS:-${BUDGET[$t]:-30}}
  scratch=target/fuzz-corpus/$t
  mkdir -p "$scratch" "fuzz/artifacts/$t"
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384
        -use_value_profile=1 -print_final_stats=1
        -artifact_prefix="fuzz/artifacts/$t/")
  if [ -n "${DICT[$t]:-}" ]; then
    args+=(-dict="fuzz/dict/${DICT[$t]}.dict")
  fi
  log=target/fuzz-$t.log
  echo "fuzz: $t for ${secs} s"
  if "$bin/$t" "${args[@]}" "$scratch" "$corpus" >"$log" 2>&1; then
    grep -E "^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)" "$log" |
      sed "s/^/fuzz: $t: /"
  else
    echo "fuzz: $t FAILED; last lines of $log:" >&2
    tail -40 "$log" >&2
    for f in "fuzz/artifacts/$t"/*; do
      [ -f "$f" ] || continue
      echo "fuzz: $t: reproducer $f (base64):" >&2
      base64 -w 0 "$f" >&2
      echo >&2
    done
    failed+=("$t")
  fi
  if $merge; then
    # The smallest set with the same edge coverage (no value profile: it
    # would keep thousands), plus the named seeds and reproducers.
    merged=target/fuzz-merged/$t
    rm -rf "$merged"
    mkdir -p "$merged"
    "$bin/$t" -merge=1 -max_len=16384 "$merged" "$corpus" "$scratch" >"$log.merge" 2>&1
    find "$corpus" -type f ! -name 'seed-*' ! -name 'crash-*' ! -name 'regress-*' -delete
    for f in "$corpus"/*; do rm -f "$merged/$(sha1sum <"$f" | cut -d' ' -f1)"; done
    cp "$merged"/* "$corpus"/ 2>/dev/null || true
    echo "fuzz: $t: corpus now $(ls "$corpus" | wc -l) inputs"
  fi
done

echo "fuzz: ${#targets[@]} targets in $(( $(date +%s) - start )) s, ${#failed[@]} failed ${failed[*]:-}"
[ ${#failed[@]} -eq 0 ]
