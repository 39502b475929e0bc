//! Reordering metrics: RFC 4737 (reordered-packet ratio, reordering
//! extent, n-reordering) and RFC 5236 (reorder density RD, reorder
//! buffer-occupancy density RBD).
//!
//! Input is the arrival sequence of *sender-order numbers*: integers that
//! give each packet's position in the sending order (RTP or TCP sequence
//! numbers unwrapped, or their ranks; see [`ranks`]). Duplicates (a number
//! already seen) are discarded and counted, as both RFCs prescribe.

use std::collections::{BTreeMap, BTreeSet, HashSet};

/// RFC 4737 sample metrics of one arrival sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rfc4737 {
    /// Packets considered (duplicates excluded).
    pub received: u64,
    /// Duplicates discarded.
    pub duplicates: u64,
    /// Reordered singletons: `s < NextExp` on arrival (Section 3.3).
    pub reordered: u64,
    /// Histogram of reordering extent `e` (Section 4.2.1): for a reordered
    /// packet at arrival position i, `e = i - j` with j the earliest earlier
    /// arrival whose number is larger.
    pub extent_hist: BTreeMap<u64, u64>,
    /// Histogram of the largest n for which each reordered packet is
    /// n-reordered (Section 5): the n arrivals just before it all carry
    /// larger numbers.
    pub n_hist: BTreeMap<u64, u64>,
}

impl Rfc4737 {
    /// Reordered ratio = reordered / received (Section 4.1); 0 for no packets.
    pub fn ratio(&self) -> f64 {
        if self.received == 0 {
            0.0
        } else {
            self.reordered as f64 / self.received as f64
        }
    }
    /// Largest reordering extent (0 when nothing was reordered).
    pub fn extent_max(&self) -> u64 {
        self.extent_hist.keys().next_back().copied().unwrap_or(0)
    }
    /// Mean reordering extent over reordered packets (0 when none).
    pub fn extent_mean(&self) -> f64 {
        let n: u64 = self.extent_hist.values().sum();
        if n == 0 {
            return 0.0;
        }
        self.extent_hist
            .iter()
            .map(|(e, c)| *e as f64 * *c as f64)
            .sum::<f64>()
            / n as f64
    }
    /// n-reordering ratio: packets that are n-reordered (their largest n is
    /// at least `n`) divided by received packets.
    pub fn n_ratio(&self, n: u64) -> f64 {
        if self.received == 0 {
            return 0.0;
        }
        let c: u64 = self.n_hist.range(n..).map(|(_, c)| c).sum();
        c as f64 / self.received as f64
    }
    /// Add another sample's counts (for "all flows" totals).
    pub fn merge(&mut self, o: &Rfc4737) {
        self.received += o.received;
        self.duplicates += o.duplicates;
        self.reordered += o.reordered;
        for (k, v) in &o.extent_hist {
            *self.extent_hist.entry(*k).or_default() += v;
        }
        for (k, v) in &o.n_hist {
            *self.n_hist.entry(*k).or_default() += v;
        }
    }
}

/// Compute RFC 4737 metrics over an arrival sequence. `NextExp` starts at
/// the first arrival's number.
pub fn rfc4737(arrivals: &[i64]) -> Rfc4737 {
    let mut m = Rfc4737::default();
    let mut seen = HashSet::with_capacity(arrivals.len());
    let mut s: Vec<i64> = Vec::with_capacity(arrivals.len());
    for &a in arrivals {
        if seen.insert(a) {
            s.push(a);
        } else {
            m.duplicates += 1;
        }
    }
    m.received = s.len() as u64;
    // prefix_max[i] = max(s[0..=i]); nondecreasing, so "earliest j with
    // s[j] > x" is a binary search on it.
    let mut prefix_max = Vec::with_capacity(s.len());
    let mut next_exp: Option<i64> = None;
    for (i, &x) in s.iter().enumerate() {
        let reordered = matches!(next_exp, Some(ne) if x < ne);
        if reordered {
            m.reordered += 1;
            let j = prefix_max.partition_point(|&pm: &i64| pm <= x);
            *m.extent_hist.entry((i - j) as u64).or_default() += 1;
            let n = s[..i].iter().rev().take_while(|&&y| y > x).count() as u64;
            *m.n_hist.entry(n).or_default() += 1;
        } else {
            next_exp = Some(x + 1);
        }
        let pm = prefix_max.last().map_or(x, |&p: &i64| p.max(x));
        prefix_max.push(pm);
    }
    m
}

/// RFC 5236 metrics of one arrival sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rfc5236 {
    /// Displacement threshold DT used.
    pub dt: u64,
    /// Packets considered (duplicates excluded).
    pub received: u64,
    /// Duplicates discarded.
    pub duplicates: u64,
    /// FD\[D\]: how many packets had displacement D = receive index − number
    /// (negative: early, positive: late), for |D| ≤ DT.
    pub fd: BTreeMap<i64, u64>,
    /// Packets whose |D| exceeded DT (left out of RD, as the RFC treats them as lost).
    pub beyond_dt: u64,
    /// FB\[B\]: how many arrivals left the reorder buffer holding B packets.
    pub fb: BTreeMap<u64, u64>,
    /// Times the buffer exceeded DT and the awaited packet was declared lost.
    pub declared_lost: u64,
}

impl Rfc5236 {
    /// RD\[D\] = FD\[D\] / Σ FD.
    pub fn rd(&self) -> BTreeMap<i64, f64> {
        let n: u64 = self.fd.values().sum();
        self.fd
            .iter()
            .map(|(k, v)| (*k, *v as f64 / n.max(1) as f64))
            .collect()
    }
    /// RBD\[B\] = FB\[B\] / Σ FB.
    pub fn rbd(&self) -> BTreeMap<u64, f64> {
        let n: u64 = self.fb.values().sum();
        self.fb
            .iter()
            .map(|(k, v)| (*k, *v as f64 / n.max(1) as f64))
            .collect()
    }
    /// RD\[0\]: fraction of packets that arrived exactly in place.
    pub fn rd0(&self) -> f64 {
        self.rd().get(&0).copied().unwrap_or(0.0)
    }
    /// Mean buffer occupancy Σ B·RBD\[B\].
    pub fn rbd_mean(&self) -> f64 {
        self.rbd().iter().map(|(b, p)| *b as f64 * p).sum()
    }
    /// Add another sample's counts.
    pub fn merge(&mut self, o: &Rfc5236) {
        self.dt = self.dt.max(o.dt);
        self.received += o.received;
        self.duplicates += o.duplicates;
        self.beyond_dt += o.beyond_dt;
        self.declared_lost += o.declared_lost;
        for (k, v) in &o.fd {
            *self.fd.entry(*k).or_default() += v;
        }
        for (k, v) in &o.fb {
            *self.fb.entry(*k).or_default() += v;
        }
    }
}

/// Compute RD and RBD with displacement threshold `dt` over an arrival
/// sequence of loss-free sender-order numbers (use [`ranks`]): the smallest
/// number is the first expected one, and the receive index counts
/// non-duplicate arrivals from it.
pub fn rfc5236(arrivals: &[i64], dt: u64) -> Rfc5236 {
    let mut m = Rfc5236 {
        dt,
        ..Default::default()
    };
    let Some(&base) = arrivals.iter().min() else {
        return m;
    };
    let mut seen = HashSet::with_capacity(arrivals.len());
    let mut ri = base;
    let mut expected = base;
    let mut buffer: BTreeSet<i64> = BTreeSet::new();
    for &s in arrivals {
        if !seen.insert(s) {
            m.duplicates += 1;
            continue;
        }
        m.received += 1;
        // RD: displacement of this packet.
        let d = ri - s;
        if d.unsigned_abs() <= dt {
            *m.fd.entry(d).or_default() += 1;
        } else {
            m.beyond_dt += 1;
        }
        ri += 1;
        // RBD: a receiver that releases packets only in order.
        if s == expected {
            expected += 1;
            while buffer.remove(&expected) {
                expected += 1;
            }
        } else if s > expected {
            buffer.insert(s);
            while buffer.len() as u64 > dt {
                // The awaited packets are declared lost; release what follows.
                let first = *buffer.iter().next().expect("buffer is not empty");
                m.declared_lost += (first - expected) as u64;
                expected = first;
                while buffer.remove(&expected) {
                    expected += 1;
                }
            }
        }
        // s < expected: a packet already declared lost arrived; not buffered.
        *m.fb.entry(buffer.len() as u64).or_default() += 1;
    }
    m
}

/// Replace each number by its rank (1-based) among the distinct numbers of
/// the sequence: turns byte sequence numbers (TCP) or numbers with gaps
/// (losses) into a loss-free packet order. Equal numbers get equal ranks.
pub fn ranks(xs: &[i64]) -> Vec<i64> {
    let mut sorted: Vec<i64> = xs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    xs.iter()
        .map(|x| sorted.binary_search(x).map_or(0, |i| i as i64 + 1))
        .collect()
}
