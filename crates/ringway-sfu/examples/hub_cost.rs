//! Microbenchmark (not a test) of the JackTrip hub core's per-packet cost,
//! without I/O: N clients (16-bit mono, 48 kHz, FRAMES frames) send in
//! turn; prints the CPU time per datagram handled (mix, encode, outbox).
//!
//!     cargo run --release -p ringway-sfu --example hub_cost [FRAMES]

use ringway_sfu::jacktrip::{encode_sample, Header, Hub, HubConfig, Outbox, HEADER_LEN};
use std::net::SocketAddr;
use std::time::Instant;

fn packet(seq: u16, frames: u16) -> Vec<u8> {
    let mut d = vec![0u8; HEADER_LEN + frames as usize * 2];
    Header {
        timestamp_us: 0,
        seq,
        frames,
        rate_code: 3,
        bits: 16,
        channels_in: 1,
        channels_out_field: 0,
    }
    .write(&mut d);
    for (i, s) in d[HEADER_LEN..].chunks_exact_mut(2).enumerate() {
        encode_sample((i as f32 * 0.05).sin() * 0.3, s, 16);
    }
    d
}

fn main() {
    let frames: u16 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(64);
    let period = u64::from(frames) * 1_000_000_000 / 48_000;
    for n in [2u16, 4, 8] {
        let mut hub = Hub::new(HubConfig::default()).expect("hub");
        let addr = |p: u16| SocketAddr::from(([10, 0, 0, 1], 5000 + p));
        for p in 0..n {
            hub.handshake(0, addr(p).ip(), addr(p).port());
        }
        let mut out = Outbox::new();
        let rounds = 200_000 / u64::from(n);
        let packets: Vec<Vec<u8>> = (0..4).map(|s| packet(s, frames)).collect();
        let (mut sent, mut now) = (0usize, 0u64);
        let start = Instant::now();
        for r in 0..rounds {
            for p in 0..n {
                now = r * period + u64::from(p) * 1000;
                let d = &packets[(r % 4) as usize];
                hub.handle(now, addr(p), d, &mut out);
            }
            hub.tick(now, &mut out);
            sent += out.len();
            out.clear();
        }
        let ns = start.elapsed().as_nanos() as f64 / (rounds * u64::from(n)) as f64;
        println!(
            "{n} clients, {frames} frames: {ns:.0} ns per datagram in ({:.2} packets out per datagram)",
            sent as f64 / (rounds * u64::from(n)) as f64
        );
    }
}
