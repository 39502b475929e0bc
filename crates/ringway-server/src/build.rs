//! What this build is: the version and the git commit it was built from
//! (`ringway --version`, `ringway_build_info` in `/metrics`).

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit (12 hex digits) of HEAD at build time, or
/// `unknown` when built outside a git checkout without `RINGWAY_COMMIT`.
pub const COMMIT: &str = env!("RINGWAY_COMMIT");
/// `VERSION (commit COMMIT)`.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RINGWAY_COMMIT"),
    ")"
);
