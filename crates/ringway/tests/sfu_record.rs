//! Recording: known L16 and L24 samples sent through a real `ringway sfu
//! serve --record-dir` process (loopback UDP), converted by `ringway sfu
//! record convert`, come back sample for sample; the byte cap stops the
//! recording and counts what it dropped.

mod sfu_common;

use sfu_common::{Peer, Server, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const FRAMES: usize = 64;

/// Deterministic samples in `bits` (16 or 24) with both extremes.
fn samples(n: usize, bits: u32, seed: u64) -> Vec<i32> {
    let mut x = seed;
    let max = (1i64 << (bits - 1)) - 1;
    (0..n)
        .map(|i| match i % 97 {
            0 => max as i32,
            1 => (-max - 1) as i32,
            _ => {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) as i64 % (max + 1)) as i32 * if x & 1 == 0 { 1 } else { -1 }
            }
        })
        .collect()
}

/// An RTP packet (no extension) carrying `s` big-endian in `bytes` per sample.
fn rtp(pt: u8, seq: u16, ts: u32, ssrc: u32, s: &[i32], bytes: usize) -> Vec<u8> {
    let mut b = vec![0x80, pt];
    b.extend_from_slice(&seq.to_be_bytes());
    b.extend_from_slice(&ts.to_be_bytes());
    b.extend_from_slice(&ssrc.to_be_bytes());
    for v in s {
        b.extend_from_slice(&v.to_be_bytes()[4 - bytes..]);
    }
    b
}

/// Send `pcm` (interleaved, `channels`) as packets of FRAMES frames from
/// sequence number `seq0`; packets 5 and 6 swapped, packet 9 sent twice.
/// Returns the datagrams sent.
fn send_stream(p: &Peer, pt: u8, pcm: &[i32], channels: usize, bytes: usize, seq0: u16) -> usize {
    let ssid = p.session.unwrap().ssid;
    let per = FRAMES * channels;
    let mut packets: Vec<Vec<u8>> = pcm
        .chunks(per)
        .enumerate()
        .map(|(k, c)| {
            rtp(
                pt,
                seq0.wrapping_add(k as u16),
                0xFFFF_F000u32.wrapping_add((k * FRAMES) as u32),
                ssid,
                c,
                bytes,
            )
        })
        .collect();
    packets.swap(5, 6);
    let dup = packets[9].clone();
    packets.insert(10, dup);
    for (k, b) in packets.iter().enumerate() {
        p.sock.send_to(b, p.server).unwrap();
        if k % 16 == 15 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    packets.len()
}

/// (channels, rate, bits, samples) of a PCM WAV file.
fn read_wav(path: &Path) -> (u16, u32, u16, Vec<i32>) {
    let w = std::fs::read(path).unwrap();
    assert_eq!(&w[..4], b"RIFF");
    assert_eq!(&w[8..16], b"WAVEfmt ");
    assert_eq!(u16::from_le_bytes([w[20], w[21]]), 1, "PCM");
    let ch = u16::from_le_bytes([w[22], w[23]]);
    let rate = u32::from_le_bytes(w[24..28].try_into().unwrap());
    let bits = u16::from_le_bytes([w[34], w[35]]);
    assert_eq!(&w[36..40], b"data");
    let len = u32::from_le_bytes(w[40..44].try_into().unwrap()) as usize;
    assert_eq!(w.len(), 44 + len);
    let b = bits as usize / 8;
    let s = w[44..]
        .chunks_exact(b)
        .map(|c| {
            // Little-endian sample into the top bytes, then sign-extend.
            let v = c
                .iter()
                .enumerate()
                .fold(0u32, |v, (k, x)| v | u32::from(*x) << (8 * (k + 4 - b)));
            (v as i32) >> (32 - bits)
        })
        .collect();
    (ch, rate, bits, s)
}

fn convert(dir: &Path, out: &Path) -> String {
    let o = Command::new(BIN)
        .args([
            "sfu",
            "record",
            "convert",
            "--pt",
            "96=L16/48000/1",
            "--pt",
            "97=L24/48000/2",
            "--out",
        ])
        .arg(out)
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

fn wav_of(out: &Path, ssid: u32, pt: u8) -> PathBuf {
    let suffix = format!("-{ssid:08x}-pt{pt}.wav");
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(&suffix))
        .unwrap_or_else(|| panic!("no {suffix} in {}", out.display()))
}

#[test]
fn recorded_session_converts_to_the_sent_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("rec");
    let server = Server::start(
        "mmsg",
        &["--record-dir", rec.to_str().unwrap(), "--no-echo"],
    );
    let mut a = Peer::new(server.addr);
    let mut b = Peer::new(server.addr);
    let sa = a.register().ssid;
    let sb = b.register().ssid;
    let mono = samples(FRAMES * 200, 16, 1);
    let stereo = samples(FRAMES * 2 * 150, 24, 2);
    // Sequence numbers and timestamps wrap inside the streams.
    let na = send_stream(&a, 96, &mono, 1, 2, 65_500);
    let nb = send_stream(&b, 97, &stereo, 2, 3, 65_400);
    // RTCP (a sender report) is not forwarded, so not recorded.
    let mut rtcp = vec![0x80, 200, 0, 6];
    rtcp.extend_from_slice(&sa.to_be_bytes());
    rtcp.extend_from_slice(&[0; 20]);
    a.sock.send_to(&rtcp, a.server).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let report = server.stop();
    let r = &report["recording"];
    assert_eq!(r["packets"], (na + nb) as u64, "{r}");
    assert_eq!(r["files"], 2, "{r}");
    assert_eq!(r["dropped_queue_full"], 0, "{r}");
    assert_eq!(r["dropped_disk_full"], 0, "{r}");
    assert_eq!(r["full"], false, "{r}");
    let out = tmp.path().join("wav");
    let text = convert(&rec, &out);
    assert!(text.contains("duplicates=1"), "{text}");
    let (ch, rate, bits, got) = read_wav(&wav_of(&out, sa, 96));
    assert_eq!((ch, rate, bits), (1, 48_000, 16));
    assert_eq!(got.len(), mono.len());
    assert!(got == mono, "L16 samples differ");
    let (ch, rate, bits, got) = read_wav(&wav_of(&out, sb, 97));
    assert_eq!((ch, rate, bits), (2, 48_000, 24));
    assert_eq!(got.len(), stereo.len());
    assert!(got == stereo, "L24 samples differ");
}

#[test]
fn byte_cap_stops_the_recording_and_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("rec");
    let cap = 3000u64;
    let server = Server::start(
        "socket",
        &[
            "--record-dir",
            rec.to_str().unwrap(),
            "--record-max-bytes",
            &cap.to_string(),
        ],
    );
    let mut a = Peer::new(server.addr);
    let sa = a.register().ssid;
    let pcm = samples(FRAMES * 50, 16, 3);
    let sent = send_stream(&a, 96, &pcm, 1, 2, 0);
    std::thread::sleep(Duration::from_millis(300));
    let report = server.stop();
    let r = &report["recording"];
    // 16-byte file header, then 12 + 12 + 128 bytes per packet.
    let fit = (cap - 16) / (12 + 12 + 2 * FRAMES as u64);
    assert_eq!(r["packets"], fit, "{r}");
    assert_eq!(r["full"], true, "{r}");
    assert_eq!(r["dropped_disk_full"], sent as u64 - fit, "{r}");
    let on_disk: u64 = std::fs::read_dir(&rec)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk <= cap, "{on_disk} bytes on disk, cap {cap}");
    assert_eq!(r["bytes"], on_disk, "{r}");
    // What was recorded is the start of the stream, intact: the first
    // `fit` datagrams, one of which (the 11th) was a duplicate.
    let out = tmp.path().join("wav");
    convert(&rec, &out);
    let (_, _, _, got) = read_wav(&wav_of(&out, sa, 96));
    assert_eq!(got.len(), (fit as usize - 1) * FRAMES);
    assert!(got[..] == pcm[..got.len()], "recorded samples differ");
}
