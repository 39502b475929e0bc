//! Recordings of forwarded media, without I/O: the file format (one file
//! per source), its bounds-checked reader, and the conversion of L16/L24
//! RTP payloads to PCM tracks and WAV files through a payload-type map.
//!
//! A recording file is a 16-byte header, then records:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `RINGWREC` |
//! | 2 | version (1), little-endian |
//! | 2 | header length (16) |
//! | 4 | source SSID, little-endian |
//!
//! Each record: arrival time (Unix ns, u64 LE), packet length (u16 LE,
//! 1..=[`MAX_PACKET`]), two zero bytes, then the RTP packet as received.

use crate::wire::RtpPacket;
use std::collections::BTreeMap;
use std::fmt;

/// File magic.
pub const MAGIC: &[u8; 8] = b"RINGWREC";
/// Format version written and read.
pub const VERSION: u16 = 1;
/// File header length.
pub const HEADER_LEN: usize = 16;
/// Record header length (before the packet).
pub const RECORD_HEADER_LEN: usize = 12;
/// Longest packet a record may hold (the SFU's receive frame).
pub const MAX_PACKET: usize = 2048;

/// Why a recording file could not be read (offsets in bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Shorter than the header, or not a recording.
    BadMagic,
    /// A version or header length this reader does not know.
    BadVersion(u16, u16),
    /// The file ends inside the record at this offset (a recorder stopped
    /// mid-write): the records before it are intact.
    Truncated(usize),
    /// The record at this offset claims a length of 0 or more than
    /// [`MAX_PACKET`], or non-zero reserved bytes.
    BadRecord(usize),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::BadMagic => write!(f, "not a ringway recording (bad magic)"),
            RecordError::BadVersion(v, h) => {
                write!(f, "unknown recording version {v} (header length {h})")
            }
            RecordError::Truncated(o) => write!(f, "file ends inside the record at byte {o}"),
            RecordError::BadRecord(o) => write!(f, "bad record header at byte {o}"),
        }
    }
}

impl std::error::Error for RecordError {}

/// The file header for source `ssid`.
pub fn file_header(ssid: u32) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8..10].copy_from_slice(&VERSION.to_le_bytes());
    header[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    header[12..16].copy_from_slice(&ssid.to_le_bytes());
    header
}

/// The record header for a packet of `len` bytes (1..=[`MAX_PACKET`])
/// that arrived at `unix_ns`; `None` if `len` is out of range.
pub fn record_header(unix_ns: u64, len: usize) -> Option<[u8; RECORD_HEADER_LEN]> {
    if len == 0 || len > MAX_PACKET {
        return None;
    }
    let mut header = [0u8; RECORD_HEADER_LEN];
    header[..8].copy_from_slice(&unix_ns.to_le_bytes());
    header[8..10].copy_from_slice(&(len as u16).to_le_bytes());
    Some(header)
}

/// One recorded packet.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Arrival at the SFU, Unix ns.
    pub unix_ns: u64,
    /// The packet as received.
    pub packet: &'a [u8],
}

/// A view of a recording file: its source and an iterator over records.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    /// The source SSID from the header.
    pub ssid: u32,
    buf: &'a [u8],
    off: usize,
    failed: bool,
}

impl<'a> Reader<'a> {
    /// Check the header of `buf`.
    pub fn new(buf: &'a [u8]) -> Result<Reader<'a>, RecordError> {
        if buf.len() < HEADER_LEN || &buf[..8] != MAGIC {
            return Err(RecordError::BadMagic);
        }
        let version = u16::from_le_bytes([buf[8], buf[9]]);
        let header = u16::from_le_bytes([buf[10], buf[11]]);
        if version != VERSION || header as usize != HEADER_LEN {
            return Err(RecordError::BadVersion(version, header));
        }
        Ok(Reader {
            ssid: u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]),
            buf,
            off: HEADER_LEN,
            failed: false,
        })
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>, RecordError>;

    /// The next record; after an error, `None`.
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.off >= self.buf.len() {
            return None;
        }
        let offset = self.off;
        let rest = &self.buf[offset..];
        let Some(header) = rest.get(..RECORD_HEADER_LEN) else {
            self.failed = true;
            return Some(Err(RecordError::Truncated(offset)));
        };
        let unix_ns = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
        let len = u16::from_le_bytes([header[8], header[9]]) as usize;
        if len == 0 || len > MAX_PACKET || header[10] != 0 || header[11] != 0 {
            self.failed = true;
            return Some(Err(RecordError::BadRecord(offset)));
        }
        let Some(packet) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
            self.failed = true;
            return Some(Err(RecordError::Truncated(offset)));
        };
        self.off = offset + RECORD_HEADER_LEN + len;
        Some(Ok(Record { unix_ns, packet }))
    }
}

/// Sample encoding of a payload type (RFC 3551 L16, RFC 3190 L24: signed
/// big-endian, interleaved channels).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// 16-bit linear.
    L16,
    /// 24-bit linear.
    L24,
}

impl Encoding {
    /// Bytes per sample.
    pub fn bytes(self) -> usize {
        match self {
            Encoding::L16 => 2,
            Encoding::L24 => 3,
        }
    }
}

/// What a payload type carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PayloadFormat {
    /// Sample encoding.
    pub encoding: Encoding,
    /// Sample rate (Hz; also the RTP clock).
    pub rate: u32,
    /// Interleaved channels.
    pub channels: u16,
}

/// Most channels a payload format may declare.
pub const MAX_CHANNELS: u16 = 32;

/// Payload type → format, e.g. from `96=L16/48000/1`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PayloadMap(BTreeMap<u8, PayloadFormat>);

impl PayloadMap {
    /// Add one `PT=ENC/RATE[/CHANNELS]` entry (channels default to 1).
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let bad =
            |why: &str| format!("payload map entry {spec:?}: {why} (want e.g. 96=L16/48000/1)");
        let (payload_type, fmt) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
        let payload_type: u8 = payload_type
            .trim()
            .parse()
            .ok()
            .filter(|p| *p < 128)
            .ok_or_else(|| bad("payload type must be 0-127"))?;
        let mut parts = fmt.trim().split('/');
        let encoding = match parts.next().map(str::to_ascii_uppercase).as_deref() {
            Some("L16") => Encoding::L16,
            Some("L24") => Encoding::L24,
            _ => return Err(bad("encoding must be L16 or L24")),
        };
        let rate: u32 = parts
            .next()
            .and_then(|r| r.parse().ok())
            .filter(|r| (1..=768_000).contains(r))
            .ok_or_else(|| bad("rate must be 1-768000"))?;
        let channels: u16 = match parts.next() {
            None => 1,
            Some(c) => c
                .parse()
                .ok()
                .filter(|c| (1..=MAX_CHANNELS).contains(c))
                .ok_or_else(|| bad("channels must be 1-32"))?,
        };
        if parts.next().is_some() {
            return Err(bad("too many fields"));
        }
        self.0.insert(
            payload_type,
            PayloadFormat {
                encoding,
                rate,
                channels,
            },
        );
        Ok(())
    }

    /// The format of payload type `pt`.
    pub fn get(&self, pt: u8) -> Option<PayloadFormat> {
        self.0.get(&pt).copied()
    }
}

/// Counters of one conversion.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConvertStats {
    /// Records read.
    pub records: u64,
    /// Records that were not RTP (or not parseable as RTP).
    pub not_rtp: u64,
    /// RTP packets whose payload type is not in the map.
    pub unmapped: u64,
    /// Payloads that are not a whole number of sample frames.
    pub bad_payload: u64,
    /// Packets with a sequence number already seen.
    pub duplicates: u64,
    /// Packets placed before the track's first sample (dropped).
    pub too_early: u64,
    /// Gaps filled with silence.
    pub gaps: u64,
    /// Timestamp jumps too long to fill (the track continues without
    /// silence).
    pub discontinuities: u64,
}

/// One track: the PCM of one (SSRC, payload type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Track {
    /// RTP SSRC.
    pub ssrc: u32,
    /// RTP payload type.
    pub payload_type: u8,
    /// Its format.
    pub format: PayloadFormat,
    /// Interleaved samples, sign-extended to i32.
    pub samples: Vec<i32>,
}

/// A packet waiting to be placed.
struct Pending<'a> {
    ext_seq: i64,
    timestamp: u32,
    payload: &'a [u8],
}

/// Longest silence (s) filled for one gap; longer jumps are closed.
pub const MAX_GAP_S: u32 = 2;

/// Convert the records of one recording into tracks, one per (SSRC,
/// payload type) mapped in `map`, in order of appearance. Packets are put
/// in sequence-number order (duplicates dropped) and placed by RTP
/// timestamp: gaps up to [`MAX_GAP_S`] become silence, while the silence
/// added in total stays below the samples received (so the output is at
/// most about twice the input). Bad input is counted, never a panic.
pub fn convert<'a>(
    records: impl IntoIterator<Item = Record<'a>>,
    map: &PayloadMap,
    stats: &mut ConvertStats,
) -> Vec<Track> {
    // (ssrc, pt) → (format, packets, highest extended seq)
    let mut order: Vec<(u32, u8)> = Vec::new();
    let mut streams: BTreeMap<(u32, u8), (PayloadFormat, Vec<Pending<'a>>, i64)> = BTreeMap::new();
    for r in records {
        stats.records += 1;
        let Ok(packet) = RtpPacket::new_checked(r.packet) else {
            stats.not_rtp += 1;
            continue;
        };
        let packet_type = packet.payload_type();
        let Some(format) = map.get(packet_type) else {
            stats.unmapped += 1;
            continue;
        };
        let frame = format.encoding.bytes() * format.channels as usize;
        if packet.payload().is_empty() || packet.payload().len() % frame != 0 {
            stats.bad_payload += 1;
            continue;
        }
        let key = (packet.ssrc(), packet_type);
        let entry = streams.entry(key).or_insert_with(|| {
            order.push(key);
            (format, Vec::new(), i64::from(packet.seq()))
        });
        // Extend the sequence number relative to the highest seen.
        let high = entry.2;
        let delta = packet.seq().wrapping_sub(high as u16) as i16 as i64;
        let ext_seq = high + delta;
        entry.2 = entry.2.max(ext_seq);
        entry.1.push(Pending {
            ext_seq,
            timestamp: packet.timestamp(),
            payload: packet.payload(),
        });
    }
    let mut tracks = Vec::new();
    for key in order {
        let (format, mut packets, _) = streams.remove(&key).expect("listed");
        packets.sort_by_key(|packet| packet.ext_seq);
        let before = packets.len();
        packets.dedup_by_key(|packet| packet.ext_seq);
        stats.duplicates += (before - packets.len()) as u64;
        let channels = format.channels as usize;
        let bytes = format.encoding.bytes();
        let received: usize = packets
            .iter()
            .map(|packet| packet.payload.len() / bytes)
            .sum();
        let mut silence_budget = received;
        let max_gap = (format.rate * MAX_GAP_S) as usize * channels;
        let mut samples: Vec<i32> = Vec::with_capacity(received);
        let mut prev: Option<(u32, i64)> = None; // (timestamp, frame position)
        for packet in &packets {
            let pos = match prev {
                None => 0,
                Some((ts, pos)) => pos + i64::from(packet.timestamp.wrapping_sub(ts) as i32),
            };
            if pos < 0 {
                stats.too_early += 1;
                continue;
            }
            let mut start = pos as usize * channels;
            let mut pos = pos;
            if start > samples.len() {
                let gap = start - samples.len();
                if gap <= max_gap && gap <= silence_budget {
                    silence_budget -= gap;
                    stats.gaps += 1;
                } else {
                    stats.discontinuities += 1;
                    start = samples.len();
                    pos = (start / channels) as i64;
                }
            }
            let frames = packet.payload.len() / bytes;
            if samples.len() < start + frames {
                samples.resize(start + frames, 0);
            }
            for (k, s) in packet.payload.chunks_exact(bytes).enumerate() {
                samples[start + k] = match format.encoding {
                    Encoding::L16 => i32::from(i16::from_be_bytes([s[0], s[1]])),
                    Encoding::L24 => i32::from_be_bytes([s[0], s[1], s[2], 0]) >> 8,
                };
            }
            prev = Some((packet.timestamp, pos));
        }
        tracks.push(Track {
            ssrc: key.0,
            payload_type: key.1,
            format,
            samples,
        });
    }
    tracks
}

/// A WAV file (RIFF, PCM) of `track`: 16-bit for L16, 24-bit for L24.
/// `None` if it would exceed the 4 GiB RIFF limit.
pub fn wav(track: &Track) -> Option<Vec<u8>> {
    let bytes = track.format.encoding.bytes();
    let data_len = u32::try_from(track.samples.len().checked_mul(bytes)?).ok()?;
    let riff_len = data_len.checked_add(36)?;
    let channels = track.format.channels;
    let rate = track.format.rate;
    let block = channels * bytes as u16;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&riff_len.to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(&(8 * bytes as u16).to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in &track.samples {
        out.extend_from_slice(&s.to_le_bytes()[..bytes]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{write_rtp, RtpHeader};
    use proptest::prelude::*;

    fn rtp(pt: u8, seq: u16, ts: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 12 + payload.len()];
        let h = RtpHeader {
            payload_type: pt,
            marker: false,
            seq,
            timestamp: ts,
            ssrc: 7,
        };
        let n = write_rtp(&mut b, &h, None, 12 + payload.len()).unwrap();
        b.truncate(n);
        let off = n - payload.len();
        b[off..].copy_from_slice(payload);
        b
    }

    fn file(packets: &[Vec<u8>]) -> Vec<u8> {
        let mut f = file_header(7).to_vec();
        for (i, p) in packets.iter().enumerate() {
            f.extend_from_slice(&record_header(i as u64, p.len()).unwrap());
            f.extend_from_slice(p);
        }
        f
    }

    fn l16(v: &[i16]) -> Vec<u8> {
        v.iter().flat_map(|s| s.to_be_bytes()).collect()
    }

    fn map(s: &[&str]) -> PayloadMap {
        let mut m = PayloadMap::default();
        for e in s {
            m.add(e).unwrap();
        }
        m
    }

    fn run(f: &[u8], m: &PayloadMap) -> (Vec<Track>, ConvertStats) {
        let mut st = ConvertStats::default();
        let r = Reader::new(f).unwrap().map(Result::unwrap);
        (convert(r, m, &mut st), st)
    }

    #[test]
    fn reorders_dedups_fills_gaps_across_wraps() {
        let m = map(&["96=L16/48000/1"]);
        let p = |seq: u16, ts: u32, v: &[i16]| rtp(96, seq, ts, &l16(v));
        let f = file(&[
            p(65534, u32::MAX - 1, &[1, 2]),
            p(0, 2, &[5, 6]), // before 65535: reordered
            p(65535, 0, &[3, 4]),
            p(65535, 0, &[3, 4]), // duplicate
            p(2, 6, &[9, 10]),    // seq 1 lost: 2 samples of silence
            rtp(13, 3, 10, &[0; 4]),
        ]);
        let (t, st) = run(&f, &m);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].samples, vec![1, 2, 3, 4, 5, 6, 0, 0, 9, 10]);
        assert_eq!((st.duplicates, st.gaps, st.unmapped), (1, 1, 1));
    }

    #[test]
    fn l24_stereo_and_wav_header() {
        let m = map(&["97=L24/44100/2"]);
        let payload = [0x80, 0, 0, 0x7f, 0xff, 0xff, 0, 0, 1, 0xff, 0xff, 0xff];
        let (t, _) = run(&file(&[rtp(97, 1, 0, &payload)]), &m);
        assert_eq!(t[0].samples, vec![-8_388_608, 8_388_607, 1, -1]);
        let w = wav(&t[0]).unwrap();
        assert_eq!(&w[..4], b"RIFF");
        assert_eq!(u16::from_le_bytes([w[22], w[23]]), 2);
        assert_eq!(u32::from_le_bytes(w[24..28].try_into().unwrap()), 44100);
        assert_eq!(u16::from_le_bytes([w[34], w[35]]), 24);
        assert_eq!(&w[44..47], &[0, 0, 0x80]);
        assert_eq!(w.len(), 44 + 12);
    }

    #[test]
    fn huge_timestamp_jumps_are_closed_not_filled() {
        let m = map(&["96=L16/48000/1"]);
        let f = file(&[
            rtp(96, 1, 0, &l16(&[1])),
            rtp(96, 2, 2_000_000_000, &l16(&[2])),
            rtp(96, 3, 2_000_000_001, &l16(&[3, 3, 3])),
        ]);
        let (t, st) = run(&f, &m);
        assert_eq!(t[0].samples, vec![1, 2, 3, 3, 3]);
        assert_eq!(st.discontinuities, 1);
        // An odd-length L16 payload is counted, not converted.
        let (t, st) = run(&file(&[rtp(96, 1, 0, &[1, 2, 3])]), &m);
        assert!(t.is_empty());
        assert_eq!(st.bad_payload, 1);
    }

    #[test]
    fn payload_map_entries() {
        let mut m = PayloadMap::default();
        m.add("96=L16/48000/1").unwrap();
        m.add("100=l24/96000").unwrap();
        assert_eq!(m.get(100).unwrap().channels, 1);
        for bad in [
            "96",
            "128=L16/48000",
            "96=PCMU/8000",
            "96=L16/0",
            "96=L16/48000/0",
            "96=L16/48000/33",
            "96=L16/48000/1/x",
        ] {
            assert!(PayloadMap::default().add(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reader_stops_at_bad_or_truncated_records() {
        let p = rtp(96, 1, 0, &l16(&[1, 2]));
        let f = file(&[p.clone(), p.clone()]);
        assert_eq!(Reader::new(&f).unwrap().count(), 2);
        let cut = &f[..f.len() - 1];
        let r: Vec<_> = Reader::new(cut).unwrap().collect();
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[1],
            Err(RecordError::Truncated(
                HEADER_LEN + RECORD_HEADER_LEN + p.len()
            ))
        );
        let mut bad = f.clone();
        bad[HEADER_LEN + 8..HEADER_LEN + 10].copy_from_slice(&4000u16.to_le_bytes());
        assert_eq!(
            Reader::new(&bad).unwrap().next(),
            Some(Err(RecordError::BadRecord(HEADER_LEN)))
        );
        assert_eq!(Reader::new(&f[..10]).err(), Some(RecordError::BadMagic));
        assert!(record_header(0, MAX_PACKET + 1).is_none());
    }

    /// The committed corpus replays: files named `ok-*` read to the end
    /// without an error, the others end in one; conversion never panics.
    #[test]
    fn corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/recording");
        let m = map(&["96=L16/48000/1", "97=L24/48000/2"]);
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("corpus present") {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let ok = match Reader::new(&data) {
                Ok(r) => {
                    let all: Vec<_> = r.collect();
                    let ok = all.iter().all(Result::is_ok);
                    let mut st = ConvertStats::default();
                    let tracks = convert(all.into_iter().flatten(), &m, &mut st);
                    for t in &tracks {
                        wav(t).unwrap();
                    }
                    ok
                }
                Err(_) => false,
            };
            assert_eq!(name.starts_with("ok-"), ok, "{name}");
            n += 1;
        }
        assert!(n >= 5, "corpus has {n} files");
    }

    proptest! {
        /// Random bytes (after a valid header or not): the reader stays in
        /// bounds and ends; conversion never panics and its output is
        /// bounded by the input.
        #[test]
        fn random_bytes_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..4096),
            with_header in any::<bool>(),
        ) {
            let mut f = if with_header { file_header(1).to_vec() } else { Vec::new() };
            f.extend_from_slice(&body);
            if let Ok(r) = Reader::new(&f) {
                let mut total = 0;
                let recs: Vec<_> = r.take(10_000).collect();
                for rec in recs.iter().flatten() {
                    prop_assert!(!rec.packet.is_empty() && rec.packet.len() <= MAX_PACKET);
                    total += RECORD_HEADER_LEN + rec.packet.len();
                }
                prop_assert!(total <= f.len());
                let m = map(&["96=L16/8000/1", "97=L24/8000/2", "0=L16/8000/1"]);
                let mut st = ConvertStats::default();
                for t in convert(recs.into_iter().flatten(), &m, &mut st) {
                    prop_assert!(t.samples.len() <= 2 * f.len() + 16_000 * 2);
                }
            }
        }
    }
}
