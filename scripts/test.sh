#!/usr/bin/env bash
# The one test command: installs what tests need, then fmt, clippy, the
# tests (release), the sans-IO tests again with overflow checks and debug
# assertions (dev profile), and a bounded coverage-guided fuzzing run.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
  local start=$SECONDS
  echo "test.sh: $*"
  "$@"
  echo "test.sh: done in $((SECONDS - start)) s: $*"
}
step scripts/install-deps.sh
step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets -- -D warnings
step cargo test --workspace --release
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
