//! Visible skips.
//!
//! libtest captures what a passing test prints through `println!` and
//! `eprintln!`, so a test that returns early after such a line looks like
//! a pass. [`skip`] writes past the capture, straight to the process's
//! stderr, and appends the line to the file named by `RINGWAY_SKIP_LOG`
//! (set by `scripts/test.sh`, which counts and lists the skips at the end).

use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

/// Report that the calling test is not checking anything because `why`
/// (a facility of the machine or data it needs is absent). The caller
/// returns afterwards.
pub fn skip(why: impl Display) {
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    let line = format!("SKIPPED {test}: {why}\n");
    // Not eprint!: that is captured for passing tests.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("RINGWAY_SKIP_LOG") {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// Data the test is meant to run on (a corpus) is absent: under CI
/// (`CI=true`) that fails the test, elsewhere it is a visible [`skip`].
pub fn data_missing(what: impl Display) {
    if std::env::var("CI").is_ok_and(|value| value == "true") {
        panic!("{what} (CI=true: the suite is meant to run on it)");
    }
    skip(what);
}

/// The folder `testdata/NAME` of the repository (test corpora the
/// repository carries), or `None` after [`data_missing`] when it is absent.
pub fn testdata(name: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata")).join(name);
    if dir.is_dir() {
        Some(dir)
    } else {
        data_missing(format!("test data {} is absent", dir.display()));
        None
    }
}
