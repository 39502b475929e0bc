//! The impairment model (the SRPIC paper's netem setup): Normal delay per
//! packet, one arrival stamp per packet, a link rate, loss, the receiver's
//! interrupt coalescing, seeded determinism; and the UDP relay built from
//! it, with the reverse path set separately.

use ringway_lab::impair::relay::{Relay, RelayConfig};
use ringway_lab::impair::{CoalesceConfig, Coalescer, LossModel, Path, PathConfig};
use std::net::UdpSocket;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Push `n` packets spaced `spacing` ns apart (100 bytes each), drain,
/// return (index, arrival time) in output order and the path's counters.
fn run(cfg: PathConfig, n: u64, spacing: u64) -> (Vec<(u64, u64)>, ringway_lab::impair::PathStats) {
    let mut p = Path::new(cfg);
    let mut out = Vec::new();
    for i in 0..n {
        let now = i * spacing;
        p.poll(now, &mut |a, x| out.push((x, a)));
        p.push(now, 100, i);
    }
    p.drain(&mut |a, x| out.push((x, a)));
    (out, p.stats())
}

fn moments(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
    (m, v.sqrt())
}

/// Delay = arrival − push time is N(α, σ²) per packet (no link, packets
/// far apart so none waits for another).
#[test]
fn delay_is_normal_with_mean_alpha_and_sd_sigma() {
    let cfg = PathConfig {
        delay_ns: 2_500_000,
        sigma_ns: 250_000, // β = 10 %
        seed: 4,
        ..Default::default()
    };
    let (out, st) = run(cfg, 40_000, 10_000_000);
    let d: Vec<f64> = out
        .iter()
        .map(|&(i, a)| (a - i * 10_000_000) as f64)
        .collect();
    let (m, sd) = moments(&d);
    assert!((m - 2.5e6).abs() < 0.01 * 2.5e6, "mean {m}");
    assert!((sd - 2.5e5).abs() < 0.02 * 2.5e5, "sd {sd}");
    let within = d.iter().filter(|&&x| (x - 2.5e6).abs() < 2.5e5).count() as f64 / d.len() as f64;
    assert!(
        (within - 0.6827).abs() < 0.01,
        "share within 1 sd: {within}"
    );
    // Uniform jitter of the same sd would put 57.7 % within 1 sd and none
    // beyond sqrt(3) sd; the Normal has 8.3 % beyond.
    let tail = d
        .iter()
        .filter(|&&x| (x - 2.5e6).abs() > 1.733 * 2.5e5)
        .count() as f64
        / d.len() as f64;
    assert!(
        (tail - 0.083).abs() < 0.01,
        "share beyond sqrt(3) sd: {tail}"
    );
    assert_eq!(st.delay_clipped, 0);
    // σ larger than α/3: negative draws are cut to 0 and counted.
    let (_, st) = run(
        PathConfig {
            sigma_ns: 2_500_000,
            ..cfg
        },
        10_000,
        10_000_000,
    );
    assert!(
        st.delay_clipped > 1_000 && st.delay_clipped < 2_200,
        "{st:?}"
    );
}

/// Reordering comes from σ against the packet spacing: none without σ,
/// more with a larger σ (or a smaller spacing), as in the paper's Table 4.
#[test]
fn reordering_grows_with_sigma_over_spacing() {
    let reordered = |sigma: u64, spacing: u64| {
        let (out, _) = run(
            PathConfig {
                delay_ns: 2_500_000,
                sigma_ns: sigma,
                seed: 9,
                ..Default::default()
            },
            20_000,
            spacing,
        );
        let seq: Vec<i64> = out.iter().map(|&(i, _)| i as i64).collect();
        ringway_reorder::metrics::rfc4737(&seq).ratio()
    };
    assert_eq!(reordered(0, 12_000), 0.0);
    let (r1, r2, r10) = (
        reordered(5_000, 12_000),
        reordered(50_000, 12_000),
        reordered(250_000, 12_000),
    );
    assert!(0.0 < r1 && r1 < r2 && r2 < r10, "{r1} {r2} {r10}");
    assert!(reordered(50_000, 120_000) < r2);
}

/// Each packet keeps its own arrival stamp; a burst read at one instant is
/// spread by the link (size / rate), so the relay's read batching does not
/// decide the order.
#[test]
fn arrival_stamps_are_per_packet_and_the_link_spaces_bursts() {
    let cfg = PathConfig {
        rate_bps: 100_000_000, // 100 bytes = 8 µs
        delay_ns: 1_000_000,
        seed: 1,
        ..Default::default()
    };
    // Three packets stamped 0, 30 µs, 60 µs (link idle between them).
    let mut p = Path::new(cfg);
    for (i, t) in [0u64, 30_000, 60_000].into_iter().enumerate() {
        p.push(t, 100, i);
    }
    let mut out = Vec::new();
    p.drain(&mut |a, x| out.push((x, a)));
    // Input link 8 µs, delay 1 ms, output link 8 µs.
    assert_eq!(out, vec![(0, 1_016_000), (1, 1_046_000), (2, 1_076_000)]);
    // The same three stamped at one instant (read in one batch late):
    // the link spaces them 8 µs apart.
    let mut p = Path::new(cfg);
    for i in 0..3 {
        p.push(0, 100, i);
    }
    let mut out = Vec::new();
    p.drain(&mut |a, x| out.push((x, a)));
    assert_eq!(out, vec![(0, 1_016_000), (1, 1_024_000), (2, 1_032_000)]);
    // poll(now) hands out exactly what has arrived by now, with its stamp.
    let mut p = Path::new(cfg);
    p.push(0, 100, 7);
    let mut got = Vec::new();
    p.poll(1_015_999, &mut |a, x| got.push((x, a)));
    assert!(got.is_empty());
    assert_eq!(
        p.next_deadline(),
        Some(1_016_000),
        "on the output link until then"
    );
    p.poll(5_000_000, &mut |a, x| got.push((x, a)));
    assert_eq!(
        got,
        vec![(7, 1_016_000)],
        "a late poll still reports the arrival time"
    );
}

/// Same seed, same decisions for the n-th packet; another seed, others.
/// Loss does not shift the delay draws of later packets.
#[test]
fn seeded_decisions_are_reproducible_per_packet() {
    let cfg = PathConfig {
        rate_bps: 1_000_000_000,
        delay_ns: 2_500_000,
        sigma_ns: 50_000,
        seed: 77,
        ..Default::default()
    };
    let a = run(cfg, 5_000, 12_000).0;
    let b = run(cfg, 5_000, 12_000).0;
    assert_eq!(a, b);
    let c = run(PathConfig { seed: 78, ..cfg }, 5_000, 12_000).0;
    assert_ne!(a, c);
    // With 30 % loss the surviving packets keep their delays (arrivals
    // are unchanged where no lost packet shared the output link).
    let (lossy, st) = run(
        PathConfig {
            loss: LossModel::Uniform(0.3),
            rate_bps: 0,
            ..cfg
        },
        5_000,
        12_000,
    );
    let (clean, _) = run(PathConfig { rate_bps: 0, ..cfg }, 5_000, 12_000);
    let clean: std::collections::HashMap<u64, u64> = clean.into_iter().collect();
    assert!(lossy.iter().all(|(i, a)| clean[i] == *a));
    let share = st.lost as f64 / 5_000.0;
    assert!((share - 0.3).abs() < 0.03, "{share}");
}

/// Gilbert-Elliott loss comes in bursts: mean run of consecutive losses
/// ≈ 1/p_bg, overall share ≈ the stationary mean.
#[test]
fn bursty_loss_has_long_runs() {
    let loss = LossModel::GilbertElliott {
        p_gb: 0.01,
        p_bg: 0.25,
        loss_good: 0.0,
        loss_bad: 1.0,
    };
    let n = 200_000u64;
    let (out, st) = run(
        PathConfig {
            loss,
            seed: 5,
            ..Default::default()
        },
        n,
        1_000,
    );
    let delivered: std::collections::HashSet<u64> = out.iter().map(|x| x.0).collect();
    let mut runs = Vec::new();
    let mut cur = 0u64;
    for i in 0..n {
        if delivered.contains(&i) {
            if cur > 0 {
                runs.push(cur);
            }
            cur = 0;
        } else {
            cur += 1;
        }
    }
    let mean_run = runs.iter().sum::<u64>() as f64 / runs.len() as f64;
    assert!((mean_run - 4.0).abs() < 0.4, "mean burst {mean_run}");
    let share = st.lost as f64 / n as f64;
    assert!(
        (share - loss.mean_loss()).abs() < 0.01,
        "{share} vs {}",
        loss.mean_loss()
    );
}

/// The link queue is drop-tail and the path never holds more than its bound.
#[test]
fn queues_are_bounded() {
    let cfg = PathConfig {
        rate_bps: 8_000_000, // 100 bytes = 100 µs
        queue_ns: 1_000_000,
        delay_ns: 10_000_000,
        max_packets: 1_000_000,
        ..Default::default()
    };
    let mut p = Path::new(cfg);
    for i in 0..100 {
        p.push(0, 100, i);
    }
    // 11 packets fit (the 11th starts after 10 × 100 µs = the 1 ms limit).
    assert_eq!(p.stats().queue_drops, 89);
    let mut p = Path::new(PathConfig {
        max_packets: 10,
        rate_bps: 0,
        ..cfg
    });
    for i in 0..100 {
        p.push(0, 100, i);
    }
    assert_eq!((p.queued(), p.stats().overflow), (10, 90));
}

/// The receiver's blocks depend on the arrival times only: polling on
/// time or late gives the same blocks (so SRPIC on and off, fed the same
/// arrivals, sort the same blocks).
#[test]
fn blocks_do_not_depend_on_when_the_relay_polls() {
    let path_cfg = PathConfig {
        rate_bps: 200_000_000,
        delay_ns: 2_500_000,
        sigma_ns: 10_000,
        seed: 3,
        ..Default::default()
    };
    let rx = CoalesceConfig {
        t_intr_ns: 375_000,
        rsn_pps: 580_000.0,
        ring: 512,
    };
    let blocks_with_poll_every = |step: u64| {
        let mut p = Path::new(path_cfg);
        let mut c = Coalescer::new(rx);
        let mut blocks: Vec<Vec<u64>> = Vec::new();
        let mut t = 0u64;
        let mut next_pkt = 0u64;
        // 3000 packets of 1500 bytes sent back to back at 250 Mb/s with
        // pauses: bursty, like TCP.
        let send_at = |i: u64| i * 48_000 + (i / 100) * 2_000_000;
        while next_pkt < 3000 || p.queued() > 0 {
            while next_pkt < 3000 && send_at(next_pkt) <= t {
                p.push(send_at(next_pkt), 1500, next_pkt);
                next_pkt += 1;
            }
            let mut arrived = Vec::new();
            p.poll(t, &mut |a, x| arrived.push((a, x)));
            for (a, x) in arrived {
                c.push(a, x, &mut |b| blocks.push(b.packets));
            }
            let next = p.earliest_arrival().map_or(t, |a| a.min(t));
            c.poll(t, Some(next), &mut |b| blocks.push(b.packets));
            t += step;
        }
        c.drain(&mut |b| blocks.push(b.packets));
        (blocks, c.histogram().clone())
    };
    let (fine, h) = blocks_with_poll_every(1_000);
    let (coarse, _) = blocks_with_poll_every(700_000);
    assert_eq!(fine, coarse);
    assert_eq!(h.packets(), 3000);
    assert!(h.mean() > 3.0, "bursts form blocks: mean {}", h.mean());
}

/// The UDP relay: each datagram carries its own kernel stamp, and the
/// reverse direction has its own settings (here: replies all lost,
/// requests all delivered).
#[test]
fn udp_relay_reverse_path_is_separate() {
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let server_addr = server.local_addr().unwrap();
    let relay = Relay::bind(RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        to: server_addr,
        forward: PathConfig {
            delay_ns: 1_000_000,
            seed: 2,
            ..Default::default()
        },
        reverse: PathConfig {
            loss: LossModel::Uniform(1.0),
            seed: 3,
            ..Default::default()
        },
        coalesce: None,
        duration: Duration::from_millis(1500),
    })
    .unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let h = std::thread::spawn(move || relay.run(Arc::new(AtomicBool::new(false))));
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut n = 0;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(1200) {
            if let Ok((len, from)) = server.recv_from(&mut buf) {
                n += 1;
                let _ = server.send_to(&buf[..len], from);
            }
        }
        n
    });
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut replies = 0;
    for i in 0..50u8 {
        client.send_to(&[i; 20], relay_addr).unwrap();
        let mut b = [0u8; 64];
        if client.recv(&mut b).is_ok() {
            replies += 1;
        }
    }
    let echoed = echo.join().unwrap();
    let rep = h.join().unwrap().unwrap();
    assert_eq!(echoed, 50, "{rep:?}");
    assert_eq!(replies, 0, "{rep:?}");
    assert_eq!(rep.forward.delivered, 50);
    assert_eq!((rep.reverse.packets, rep.reverse.lost), (50, 50));
    assert_eq!(rep.unstamped, 0, "every datagram had its kernel stamp");
}
