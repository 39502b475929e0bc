//! Replays the cargo-fuzz corpus (crates/ringway-sip/fuzz/corpus) in every
//! `cargo test` with the fuzz targets' own invariants
//! (`ringway_sip::invariants`), so inputs that once crashed the parser or
//! the proxy stay fixed without nightly or cargo-fuzz.

use ringway_sip::invariants::{parse_and_edit, proxy_sequence};
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    assert!(v.len() >= 10, "corpus {target} has only {} inputs", v.len());
    v
}

#[test]
fn parse_corpus_keeps_the_editor_invariants() {
    let mut parsed = 0;
    for (name, data) in corpus("parse") {
        eprintln!("{name}");
        parsed += usize::from(parse_and_edit(&data));
    }
    assert!(parsed > 0, "no corpus input parsed");
}

#[test]
fn proxy_corpus_never_emits_to_port_0_and_bounds_the_table() {
    for (name, data) in corpus("proxy") {
        eprintln!("{name}");
        proxy_sequence(&data);
    }
}
