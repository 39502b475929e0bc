//! A JackTrip hub without I/O: JackTrip 1.7's UDP packet header and audio
//! encodings, and a mixer that gives each client the sum of the others
//! (N−1), or the other's packet as it came when there is only one other
//! with the same format (plain forwarding).
//!
//! **The packet** (JackTrip's `DefaultHeaderStruct`, written by memcpy of a
//! host struct, so little-endian on every platform JackTrip ships on; 16
//! bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | time stamp (µs since the Unix epoch, sender's clock) |
//! | 8 | 2 | sequence number |
//! | 10 | 2 | buffer size (frames per packet) |
//! | 12 | 1 | sampling rate code (0 22.05k, 1 32k, 2 44.1k, 3 48k, 4 88.2k, 5 96k, 6 192k) |
//! | 13 | 1 | bit resolution (8, 16, 24, 32) |
//! | 14 | 1 | channels the sender wants from the network |
//! | 15 | 1 | channels it sends: 0 = as many as it wants, 255 = none |
//!
//! then `frames × channels × bytes` of interleaved audio (frame-major).
//! 16-bit samples are `round(x × 32767)` little-endian; 24-bit ones are
//! JackTrip's own (a 16-bit `floor(x × 32768)` and an 8-bit remainder);
//! 32-bit ones are IEEE floats. A datagram of 63 bytes of 0xFF is the exit
//! packet. (Read from JackTrip's PacketHeader, AudioInterface and
//! UdpDataProtocol sources; nothing copied.)
//!
//! **Timing.** Packets drive everything: when client k's packet arrives,
//! its audio is added to every other client j's pending mix; j's mix is
//! sent as soon as every other active client has contributed, when a
//! contributor comes again before that (its next period started), or one
//! packet period after the first contribution ([`Hub::tick`]), whichever
//! is first. The delay the hub adds to a packet is the time it waits in a
//! pending mix: 0 for the last contributor, less than a period for the
//! others. The hub itself is in [`Hub`] (module `hub`); this module is
//! the wire format.

mod hub;

pub use hub::{ClientInfo, ClientStats, Hub, HubConfig, HubStats, Outbox};

/// Header length.
pub const HEADER_LEN: usize = 16;
/// Length of JackTrip's exit packet (all 0xFF).
pub const EXIT_LEN: usize = 63;
/// Most channels per client.
pub const MAX_CHANNELS: usize = 64;
/// Most frames per packet.
pub const MAX_FRAMES: usize = 4096;

/// Sampling rate of a JackTrip rate code.
pub fn rate_of_code(code: u8) -> Option<u32> {
    Some(match code {
        0 => 22_050,
        1 => 32_000,
        2 => 44_100,
        3 => 48_000,
        4 => 88_200,
        5 => 96_000,
        6 => 192_000,
        _ => return None,
    })
}

/// The JackTrip rate code of a sampling rate.
pub fn code_of_rate(rate: u32) -> Option<u8> {
    (0..7).find(|&c| rate_of_code(c) == Some(rate))
}

/// A parsed JackTrip header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Sender's time stamp (µs).
    pub timestamp_us: u64,
    /// Sequence number.
    pub seq: u16,
    /// Frames per packet.
    pub frames: u16,
    /// Rate code.
    pub rate_code: u8,
    /// Bits per sample (8, 16, 24, 32).
    pub bits: u8,
    /// Channels the sender wants to receive.
    pub channels_in: u8,
    /// Channels field as sent (0: same as `channels_in`, 255: none).
    pub channels_out_field: u8,
}

impl Header {
    /// Channels of audio in this packet.
    pub fn channels_sent(&self) -> usize {
        match self.channels_out_field {
            0 => self.channels_in as usize,
            255 => 0,
            n => n as usize,
        }
    }
    /// Bytes per sample.
    pub fn sample_bytes(&self) -> usize {
        self.bits as usize / 8
    }
    /// Write the header into `out[..16]`.
    pub fn write(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.timestamp_us.to_le_bytes());
        out[8..10].copy_from_slice(&self.seq.to_le_bytes());
        out[10..12].copy_from_slice(&self.frames.to_le_bytes());
        out[12] = self.rate_code;
        out[13] = self.bits;
        out[14] = self.channels_in;
        out[15] = self.channels_out_field;
    }
}

/// Why a datagram is not a JackTrip audio packet.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, serde::Serialize)]
pub enum PacketError {
    /// Shorter than the header.
    #[error("shorter than the header")]
    Truncated,
    /// Bit resolution not 8, 16, 24 or 32, unknown rate code, or frame or
    /// channel counts out of range.
    #[error("bad header field")]
    BadHeader,
    /// Length does not match frames × channels × bytes per sample.
    #[error("length does not match the header")]
    BadLength,
}

/// What a datagram is.
#[derive(Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Audio: header and interleaved samples.
    Audio(Header, &'a [u8]),
    /// The exit packet.
    Exit,
}

/// Parse one datagram.
pub fn parse(buf: &[u8]) -> Result<Packet<'_>, PacketError> {
    if buf.len() == EXIT_LEN && buf.iter().all(|&b| b == 0xff) {
        return Ok(Packet::Exit);
    }
    if buf.len() < HEADER_LEN {
        return Err(PacketError::Truncated);
    }
    let header = Header {
        timestamp_us: u64::from_le_bytes(buf[0..8].try_into().expect("8 bytes")),
        seq: u16::from_le_bytes([buf[8], buf[9]]),
        frames: u16::from_le_bytes([buf[10], buf[11]]),
        rate_code: buf[12],
        bits: buf[13],
        channels_in: buf[14],
        channels_out_field: buf[15],
    };
    if !matches!(header.bits, 8 | 16 | 24 | 32)
        || rate_of_code(header.rate_code).is_none()
        || header.frames == 0
        || header.frames as usize > MAX_FRAMES
        || header.channels_sent() > MAX_CHANNELS
        || header.channels_in as usize > MAX_CHANNELS
    {
        return Err(PacketError::BadHeader);
    }
    let audio = &buf[HEADER_LEN..];
    if audio.len() != header.frames as usize * header.channels_sent() * header.sample_bytes() {
        return Err(PacketError::BadLength);
    }
    Ok(Packet::Audio(header, audio))
}

/// Decode one sample (JackTrip's conversions).
pub fn decode_sample(b: &[u8], bits: u8) -> f32 {
    match bits {
        8 => f32::from(b[0] as i8) / 127.0,
        16 => f32::from(i16::from_le_bytes([b[0], b[1]])) / 32767.0,
        24 => {
            let high = f32::from(i16::from_le_bytes([b[0], b[1]]));
            (high + f32::from(b[2]) / 256.0) / 32768.0
        }
        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

/// Encode one sample, saturating at full scale.
pub fn encode_sample(sample: f32, out: &mut [u8], bits: u8) {
    let clamped = if sample.is_nan() {
        0.0
    } else {
        sample.clamp(-1.0, 1.0)
    };
    match bits {
        8 => out[0] = (clamped * 127.0).round() as i8 as u8,
        16 => out[..2].copy_from_slice(&((clamped * 32767.0).round() as i16).to_le_bytes()),
        24 => {
            let scaled = (clamped * 32768.0).min(32767.996);
            let high = scaled.floor();
            out[..2].copy_from_slice(&(high as i16).to_le_bytes());
            out[2] = ((scaled - high) * 256.0).floor().clamp(0.0, 255.0) as u8;
        }
        _ => out[..4].copy_from_slice(&clamped.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A 16-bit packet of `frames` × `ch` with every sample `v`.
    pub(super) fn packet(seq: u16, frames: u16, ch: u8, v: f32) -> Vec<u8> {
        let mut d = vec![0u8; HEADER_LEN + frames as usize * ch as usize * 2];
        Header {
            timestamp_us: 1,
            seq,
            frames,
            rate_code: 3,
            bits: 16,
            channels_in: ch,
            channels_out_field: 0,
        }
        .write(&mut d);
        for s in d[HEADER_LEN..].chunks_exact_mut(2) {
            encode_sample(v, s, 16);
        }
        d
    }

    #[test]
    fn header_roundtrip_and_checks() {
        let d = packet(7, 64, 2, 0.5);
        let Ok(Packet::Audio(h, a)) = parse(&d) else {
            panic!()
        };
        assert_eq!((h.seq, h.frames, h.bits, h.channels_sent()), (7, 64, 16, 2));
        assert_eq!(a.len(), 256);
        assert_eq!(parse(&d[..d.len() - 1]), Err(PacketError::BadLength));
        assert_eq!(parse(&d[..10]), Err(PacketError::Truncated));
        let mut bad = d.clone();
        bad[13] = 12;
        assert_eq!(parse(&bad), Err(PacketError::BadHeader));
        assert_eq!(parse(&[0xff; EXIT_LEN]), Ok(Packet::Exit));
        // 255 = sends nothing: header only.
        let mut none = d[..HEADER_LEN].to_vec();
        none[15] = 255;
        assert!(matches!(parse(&none), Ok(Packet::Audio(_, a)) if a.is_empty()));
    }

    #[test]
    fn sample_conversions() {
        let mut b = [0u8; 4];
        for bits in [8u8, 16, 24, 32] {
            for x in [-1.0f32, -0.5, 0.0, 0.25, 0.999] {
                encode_sample(x, &mut b, bits);
                let y = decode_sample(&b, bits);
                assert!((x - y).abs() < 0.01, "{bits}: {x} -> {y}");
            }
            encode_sample(3.0, &mut b, bits);
            assert!(decode_sample(&b, bits) <= 1.0001, "saturates");
        }
        encode_sample(0.5, &mut b, 16);
        assert_eq!(i16::from_le_bytes([b[0], b[1]]), 16384);
    }

    proptest! {
        #[test]
        fn valid_headers_with_random_fields(frames in 1u16..300, ch in 0u8..5, bits in prop::sample::select(vec![8u8, 16, 24, 32]), out_field in any::<u8>()) {
            let h = Header { timestamp_us: 0, seq: 0, frames, rate_code: 3, bits, channels_in: ch, channels_out_field: out_field };
            let mut d = vec![0u8; HEADER_LEN + frames as usize * h.channels_sent() * (bits as usize / 8)];
            h.write(&mut d);
            let ok = h.channels_sent() <= MAX_CHANNELS;
            prop_assert_eq!(parse(&d).is_ok(), ok);
        }
    }
}
