//! Replays every saved input of every fuzz target (`fuzz/corpus/<target>/`:
//! seeds, inputs the fuzzer kept for new coverage, and minimised crash
//! reproducers) through the target's function, as an ordinary test that
//! needs neither libFuzzer nor cargo-fuzz. A target whose corpus is
//! missing or empty fails: a replay of nothing proves nothing.

use std::path::PathBuf;

/// The inputs of `target`'s corpus, sorted by file name.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} is missing: {e}", dir.display()));
    let mut inputs: Vec<_> = entries
        .map(|e| {
            let path = e.expect("readable corpus directory").path();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, bytes)
        })
        .collect();
    inputs.sort();
    assert!(
        inputs.len() >= 5,
        "corpus {} has {} inputs: seed it (DEVELOPERS.md, Fuzzing)",
        dir.display(),
        inputs.len()
    );
    inputs
}

/// Run every input of `target` through `f`, naming the input that panics.
fn replay(target: &str, f: fn(&[u8])) {
    let inputs = corpus(target);
    for (path, bytes) in &inputs {
        if std::panic::catch_unwind(|| f(bytes)).is_err() {
            panic!(
                "{target}: {} breaks the target's invariants",
                path.display()
            );
        }
    }
    eprintln!("{target}: replayed {} inputs", inputs.len());
}

/// One test per target, so a failure names it.
macro_rules! replay_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            replay(stringify!($name), ringway_fuzz::$name);
        }
    )*};
}

replay_tests!(
    sip_parse,
    sip_digest,
    sip_proxy,
    sip_dispatch,
    sfu_wire,
    sfu_core,
    sfu_jacktrip,
    sfu_token,
    sfu_recording,
    pcap,
    nfqueue,
    rtnetlink,
    redis_reply,
    metrics_http,
    sip_tcp_framing,
    dns_response,
    sip_ws,
    sip_ws_client,
    xdp_frame,
);

#[test]
fn every_target_has_a_replay_test() {
    // The list above and ringway_fuzz::TARGETS must not drift apart.
    let tested = [
        "sip_parse",
        "sip_digest",
        "sip_proxy",
        "sip_dispatch",
        "sfu_wire",
        "sfu_core",
        "sfu_jacktrip",
        "sfu_token",
        "sfu_recording",
        "pcap",
        "nfqueue",
        "rtnetlink",
        "redis_reply",
        "metrics_http",
        "sip_tcp_framing",
        "dns_response",
        "sip_ws",
        "sip_ws_client",
        "xdp_frame",
    ];
    let targets: Vec<&str> = ringway_fuzz::TARGETS.iter().map(|t| t.0).collect();
    assert_eq!(targets, tested);
}
