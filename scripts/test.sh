#!/usr/bin/env bash
# The one test command: installs what tests need, then fmt, clippy, tests.
# Tests that cannot run their checks here (a kernel facility or data they
# need is absent) print a SKIPPED line; they are counted and listed at the
# end. Under CI=true a missing corpus the suite is meant to run fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
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
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
skip_log=$(mktemp)
trap 'rm -f "$skip_log"' EXIT
RINGWAY_SKIP_LOG=$skip_log cargo test --workspace --release
skipped=$(wc -l <"$skip_log")
echo "test.sh: $skipped test(s) skipped their checks on this machine"
if [[ $skipped -gt 0 ]]; then
    sed 's/^/  /' "$skip_log"
fi
