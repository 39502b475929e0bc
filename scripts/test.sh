#!/usr/bin/env bash
# The one test command: installs what tests need, then fmt, clippy, the
# tests (release), the sans-IO tests again with overflow checks and debug
# assertions (dev profile), and a bounded coverage-guided fuzzing run.
# Tests that cannot run their checks here (a kernel facility or data they
# need is absent) print a SKIPPED line; they are counted and listed at the
# end. Under CI=true a missing corpus the suite is meant to run fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
  local start=$SECONDS
  echo "test.sh: $*"
  "$@"
  echo "test.sh: done in $((SECONDS - start)) s: $*"
}
step scripts/install-deps.sh
# Corpora the repository carries (testdata/): their tests must run in CI.
corpora=(testdata/sip-torture/rfc4475/MANIFEST.tsv testdata/sip-torture/rfc5118/MANIFEST.tsv)
for corpus in "${corpora[@]}"; do
  if [[ ! -f $corpus ]]; then
    if [[ ${CI:-} == true ]]; then
      echo "test.sh: corpus $corpus is missing (CI=true)" >&2
      exit 1
    fi
    echo "test.sh: warning: corpus $corpus is missing; its tests will be skipped" >&2
  fi
done
step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets -- -D warnings
skip_log=$(mktemp)
trap 'rm -f "$skip_log"' EXIT
RINGWAY_SKIP_LOG=$skip_log step cargo test --workspace --release
# The Debian package: built, installed into a throwaway root with dpkg,
# the installed binary run, the unit checked by systemd-analyze verify.
step scripts/test-deb.sh
# S23: every crate's unit tests, and the protocol cores' tests (proptests,
# the fuzz corpus replay), once with overflow checks and debug assertions.
step cargo test --workspace --lib
step cargo test -p ringway-sip -p ringway-sfu -p ringway-reorder -p ringway-fuzz --tests
# Each fuzz target for its budget (about 6 minutes in all; scripts/fuzz.sh).
# RINGWAY_FUZZ=skip skips it on a developer's machine, never in CI.
if [ "${RINGWAY_FUZZ:-}" = skip ] && [ "${CI:-}" != true ]; then
  echo "test.sh: fuzzing SKIPPED (RINGWAY_FUZZ=skip)"
else
  step scripts/fuzz.sh
fi
skipped=$(wc -l <"$skip_log")
echo "test.sh: $skipped test(s) skipped their checks on this machine"
if [[ $skipped -gt 0 ]]; then
  sed 's/^/  /' "$skip_log"
fi
