#!/usr/bin/env bash
# The one test command: installs what tests need, then fmt, clippy, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release
