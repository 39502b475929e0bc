//! Serial-number arithmetic (RFC 1982) for 16-bit (RTP) and 32-bit (TCP)
//! sequence spaces.

/// Width of the sequence-number space of a flow.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SeqSpace {
    /// 16-bit space (RTP sequence numbers); values are taken modulo 2^16.
    U16,
    /// 32-bit space (TCP sequence numbers, counted in bytes).
    U32,
}

impl SeqSpace {
    /// Signed serial distance `a - b`: negative when `a` precedes `b`.
    ///
    /// RFC 1982 leaves the comparison undefined when the two values are
    /// exactly half the space apart; here that case counts as `a` preceding
    /// `b` (distance is negative), so the result is always defined.
    #[inline]
    pub fn diff(self, a: u32, b: u32) -> i32 {
        match self {
            SeqSpace::U16 => (a.wrapping_sub(b) as u16) as i16 as i32,
            SeqSpace::U32 => a.wrapping_sub(b) as i32,
        }
    }

    /// `a < b` in serial order.
    #[inline]
    pub fn lt(self, a: u32, b: u32) -> bool {
        self.diff(a, b) < 0
    }

    /// `a + n` in this space.
    #[inline]
    pub fn add(self, a: u32, n: u32) -> u32 {
        match self {
            SeqSpace::U16 => a.wrapping_add(n) & 0xffff,
            SeqSpace::U32 => a.wrapping_add(n),
        }
    }

    /// Reduce a value into this space.
    #[inline]
    pub fn norm(self, a: u32) -> u32 {
        match self {
            SeqSpace::U16 => a & 0xffff,
            SeqSpace::U32 => a,
        }
    }
}

/// Unwraps a stream of serial numbers into a monotone 64-bit line, using the
/// largest value seen so far as reference (RFC 3550 A.1 style).
#[derive(Clone, Debug)]
pub struct Unwrapper {
    space: SeqSpace,
    max: Option<(u32, i64)>,
}

impl Unwrapper {
    /// New unwrapper for `space`; the first value maps to itself.
    pub fn new(space: SeqSpace) -> Self {
        Unwrapper { space, max: None }
    }

    /// Extended value of `s`.
    pub fn unwrap(&mut self, seq: u32) -> i64 {
        let seq = self.space.norm(seq);
        match self.max {
            None => {
                self.max = Some((seq, seq as i64));
                seq as i64
            }
            Some((m, ext)) => {
                let extended = ext + self.space.diff(seq, m) as i64;
                if extended > ext {
                    self.max = Some((seq, extended));
                }
                extended
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_u16() {
        let s = SeqSpace::U16;
        assert!(s.lt(65535, 0));
        assert!(s.lt(65000, 100));
        assert!(!s.lt(100, 65000));
        assert_eq!(s.add(65535, 1), 0);
        assert_eq!(s.diff(2, 65534), 4);
        // exactly half apart: defined as "precedes"
        assert!(s.lt(0, 32768) && s.lt(32768, 0));
    }

    #[test]
    fn wrap_u32() {
        let s = SeqSpace::U32;
        assert!(s.lt(u32::MAX - 10, 5));
        assert_eq!(s.add(u32::MAX, 3), 2);
        assert!(!s.lt(5, u32::MAX));
    }

    #[test]
    fn unwrapper_crosses_zero_both_ways() {
        let mut u = Unwrapper::new(SeqSpace::U16);
        let v: Vec<i64> = [65534, 65535, 0, 65533, 1, 2]
            .iter()
            .map(|&x| u.unwrap(x))
            .collect();
        assert_eq!(v, vec![65534, 65535, 65536, 65533, 65537, 65538]);
    }
}
