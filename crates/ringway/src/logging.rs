//! The logger behind the library crates' `log` calls: the binary installs
//! it once, the libraries only emit.
//!
//! Levels default to `info` (the servers' placement and socket lines, the
//! lab's progress notes); `RINGWAY_LOG` takes per-module directives in the
//! usual `env_logger` syntax, e.g. `RINGWAY_LOG=warn,ringway_server::sip=debug`.
//! Lines read as they did when the crates printed them: the message alone at
//! `info`, `warning: ` / `error: ` before it at those levels, and the module
//! path at `debug` and `trace`.

use log::Level;
use std::io::Write;

/// Install the logger (once, at the start of `main`).
pub(crate) fn init() {
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Info)
        .parse_env("RINGWAY_LOG")
        .format(|out, record| match record.level() {
            Level::Info => writeln!(out, "{}", record.args()),
            Level::Warn => writeln!(out, "warning: {}", record.args()),
            Level::Error => writeln!(out, "error: {}", record.args()),
            level => writeln!(
                out,
                "{}: {}: {}",
                level.as_str().to_ascii_lowercase(),
                record.target(),
                record.args()
            ),
        })
        .init();
}
