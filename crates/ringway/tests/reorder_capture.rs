//! End to end: in a private network namespace, RTP packets go through the
//! `ringway lab impair` relay (the paper's model: a 1 Mb/s link, Normal
//! delay, seeded) while tcpdump captures the impaired leg on `lo`;
//! `ringway reorder analyze` must then see exactly the reordering the
//! relay's seed predicts, and less of it after SRPIC sorting.

mod reorder_common;

use ringway_lab::impair::{Path, PathConfig};
use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ringway");

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rtp(seq: u16) -> [u8; 32] {
    let mut p = [0u8; 32];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&seq.to_be_bytes());
    p[8..12].copy_from_slice(&0xcafe_f00du32.to_be_bytes());
    p
}

/// (analysis JSON, relay report, analysis table, tcpdump's stderr).
fn scenario(dir: std::path::PathBuf) -> (serde_json::Value, serde_json::Value, String, String) {
    let pcap = dir.join("impaired.pcap");
    // 1. tcpdump on lo, only the relay → receiver leg, packet-buffered.
    let td = reorder_common::tcpdump_with(
        Command::new("tcpdump"),
        "lo",
        &pcap,
        &["udp", "and", "dst", "port", "5004"],
    );

    // 2. Receiver and relay.
    let sink = UdpSocket::bind("127.0.0.1:5004").unwrap();
    sink.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut relay = Kill(
        Command::new(BIN)
            .args([
                "lab",
                "impair",
                "--listen",
                "127.0.0.1:5003",
                "--to",
                "127.0.0.1:5004",
                "--rate-mbps",
                "1",
                "--delay-ms",
                "2.5",
                "--sigma-ms",
                "0.5",
                "--seed",
                "11",
                "--duration",
                "3",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The relay announces itself on stderr once its sockets are bound.
    let rerr = relay.0.stderr.take().unwrap();
    let (rtx, rrx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(rerr).lines().map_while(Result::ok) {
            let _ = rtx.send(line);
        }
    });
    let up = rrx
        .recv_timeout(Duration::from_secs(10))
        .expect("relay reports that it is bound");
    assert!(up.contains("impair relay on 127.0.0.1:5003"), "{up}");

    // The receiver drains concurrently (a 600-datagram backlog would
    // overflow the default socket buffer).
    let receiver = std::thread::spawn(move || {
        let mut got = 0;
        let t0 = Instant::now();
        let mut buf = [0u8; 64];
        while got < 600 && t0.elapsed() < Duration::from_secs(8) {
            if sink.recv(&mut buf).is_ok() {
                got += 1;
            }
        }
        got
    });
    // 3. 600 RTP packets, sequence numbers wrapping through 0, sent with
    // sendmmsg 64 at a time: they reach the relay far faster than its
    // 1 Mb/s link carries them (480 µs per 60-byte packet), so the link
    // spaces them and the order out depends on the seed alone.
    let snd = UdpSocket::bind("127.0.0.1:0").unwrap();
    snd.connect("127.0.0.1:5003").unwrap();
    let mut io = ringway_io::open_backend(ringway_io::BackendKind::Mmsg, snd).unwrap();
    for chunk in (0..600u16).collect::<Vec<_>>().chunks(64) {
        let mut b = ringway_io::TxBatch::new(64, 64);
        for &i in chunk {
            b.push(
                "127.0.0.1:5003".parse().unwrap(),
                &rtp(65300u16.wrapping_add(i)),
            )
            .unwrap();
        }
        let mut sent = 0;
        while sent < b.len() {
            sent += io.send_batch(&b).unwrap();
            if sent < b.len() {
                panic!("sendmmsg took {sent} of {}", b.len());
            }
        }
    }
    let got = receiver.join().unwrap();
    let relay_out = wait_bounded(&mut relay.0);
    // 4. Let tcpdump write all 600 records (74-byte frames on lo: 24-byte
    // file header + 600 × (16 + 74) bytes), bounded to 5 s; then stop it
    // cleanly (SIGINT by PID) so the file is complete.
    let want = 24 + 600 * (16 + 74);
    let tw = Instant::now();
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) < want
        && tw.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let tcpdump_stats = td.interrupt();
    assert_eq!(got, 600, "all packets arrive (no loss configured)");

    // 5. Analyze, once with the whole capture as one batch, once with 100 µs batches.
    let analyze = |batch_us: &str| {
        let o = Command::new(BIN)
            .args([
                "reorder",
                "analyze",
                "--block",
                "1,32",
                "--batch-us",
                batch_us,
                "--json",
            ])
            .arg(&pcap)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let table = Command::new(BIN)
        .args([
            "reorder",
            "analyze",
            "--block",
            "1,5,10,32",
            "--batch-us",
            "1000",
        ])
        .arg(&pcap)
        .output()
        .unwrap();
    (
        analyze("10000000"),
        serde_json::from_str(&relay_out).unwrap_or(serde_json::Value::Null),
        String::from_utf8_lossy(&table.stdout).into_owned(),
        // tcpdump's exit statistics ("... packets dropped by kernel").
        tcpdump_stats,
    )
}

/// Wait up to 10 s for a child to finish (killing it after that); return its stdout.
fn wait_bounded(c: &mut Child) -> String {
    let t = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(10) {
            let _ = c.kill();
            let _ = c.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = String::new();
    if let Some(mut o) = c.stdout.take() {
        use std::io::Read;
        let _ = o.read_to_string(&mut s);
    }
    s
}

#[test]
fn analyze_capture_of_impaired_rtp() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let (an, relay, table, tcpdump) =
        ringway_io::netns::in_private_netns(move || scenario(d)).unwrap();
    eprintln!("{table}");
    let reordered_by_relay = relay["forward_reordered"].as_u64().expect("relay report");
    assert!(reordered_by_relay > 20, "{relay}");
    assert_eq!(an["packets"].as_u64(), Some(600), "tcpdump: {tcpdump}");
    assert_eq!(an["flows"].as_array().unwrap().len(), 1);
    let v = an["variants"].as_array().unwrap();
    let capture = &v[0]["total"];
    let b1 = &v[1]["total"];
    let b32 = &v[2]["total"];
    // The capture shows exactly the order the sans-IO path predicts for
    // this seed: on a backlogged link, packet i leaves the input link at
    // (i + 1) · 480 µs after the first arrival whatever the exact arrival
    // times, and its Normal delay draw decides the rest.
    let mut path = Path::new(PathConfig {
        rate_bps: 1_000_000,
        delay_ns: 2_500_000,
        sigma_ns: 500_000,
        seed: 11,
        ..Default::default()
    });
    let mut predicted = Vec::new();
    for i in 0..600u16 {
        path.push(0, 32 + 28, 65300u16.wrapping_add(i));
    }
    path.drain(&mut |_, x| predicted.push(x));
    let bytes = std::fs::read(dir.path().join("impaired.pcap")).unwrap();
    let frames = ringway_reorder::pcap::parse(&bytes).unwrap();
    let captured: Vec<u16> = frames
        .iter()
        .map(|f| {
            let (v, ip) = ringway_reorder::pcap::ip_of(f).unwrap();
            let u = ringway_reorder::pcap::udp_of(v, ip).unwrap();
            u16::from_be_bytes([u.payload[2], u.payload[3]])
        })
        .collect();
    assert_eq!(captured, predicted);
    // The relay's own count (per RTP stream, against its arrival order)
    // is the RFC 4737 count of the predicted order.
    let expected_reordered = ringway_reorder::metrics::rfc4737(
        &predicted
            .iter()
            .map(|&q| (q.wrapping_sub(65300)) as i64)
            .collect::<Vec<_>>(),
    )
    .reordered;
    assert_eq!(expected_reordered, reordered_by_relay);
    assert_eq!(capture["reordered"].as_u64(), Some(expected_reordered));
    assert!(capture["extent_max"].as_u64().unwrap() >= 2);
    // Block size 1 does not sort; block size 32 sorts most of it.
    assert_eq!(b1["reordered"], capture["reordered"]);
    assert!(
        b32["reordered"].as_u64().unwrap() * 2 < capture["reordered"].as_u64().unwrap(),
        "{b32} vs {capture}"
    );
    assert!(b32["rd0"].as_f64().unwrap() > capture["rd0"].as_f64().unwrap());
    assert!(table.contains("srpic b=10"), "{table}");
}
