//! Reordering metrics: RFC 4737 (reordered-packet ratio, reordering
//! extent, n-reordering) and RFC 5236 (reorder density RD, reorder
//! buffer-occupancy density RBD).
//!
//! Input is the arrival sequence of *sender-order numbers*: integers that
//! give each packet's position in the sending order (RTP or TCP sequence
//! numbers unwrapped, or their ranks; see [`ranks`]). Duplicates (a number
//! already seen) are discarded and counted, as both RFCs prescribe.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

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
        let total: u64 = self.extent_hist.values().sum();
        if total == 0 {
            return 0.0;
        }
        self.extent_hist
            .iter()
            .map(|(e, c)| *e as f64 * *c as f64)
            .sum::<f64>()
            / total as f64
    }
    /// n-reordering ratio: packets that are n-reordered (their largest n is
    /// at least `n`) divided by received packets.
    pub fn n_ratio(&self, n: u64) -> f64 {
        if self.received == 0 {
            return 0.0;
        }
        let count: u64 = self.n_hist.range(n..).map(|(_, count)| count).sum();
        count as f64 / self.received as f64
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
    let mut metrics = Rfc4737::default();
    let mut seen = HashSet::with_capacity(arrivals.len());
    let mut sequence: Vec<i64> = Vec::with_capacity(arrivals.len());
    for &a in arrivals {
        if seen.insert(a) {
            sequence.push(a);
        } else {
            metrics.duplicates += 1;
        }
    }
    metrics.received = sequence.len() as u64;
    // prefix_max[i] = max(sequence[0..=i]); nondecreasing, so "earliest j with
    // sequence[j] > x" is a binary search on it.
    let mut prefix_max = Vec::with_capacity(sequence.len());
    let mut next_exp: Option<i64> = None;
    for (i, &x) in sequence.iter().enumerate() {
        let reordered = matches!(next_exp, Some(ne) if x < ne);
        if reordered {
            metrics.reordered += 1;
            let first_greater = prefix_max.partition_point(|&running_max: &i64| running_max <= x);
            *metrics
                .extent_hist
                .entry((i - first_greater) as u64)
                .or_default() += 1;
            let displaced_by = sequence[..i].iter().rev().take_while(|&&y| y > x).count() as u64;
            *metrics.n_hist.entry(displaced_by).or_default() += 1;
        } else {
            next_exp = Some(x + 1);
        }
        let running_max = prefix_max.last().map_or(x, |&p: &i64| p.max(x));
        prefix_max.push(running_max);
    }
    metrics
}

/// RFC 5236 metrics of one arrival sequence.
///
/// Computed with the algorithms the RFC's authors give for RD and RBD (a
/// look-ahead window of DT + 1 arrivals and a buffer of early arrivals):
/// a packet not seen within the window is taken as lost, and a packet that
/// arrives after it was taken as lost is discarded like a duplicate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rfc5236 {
    /// Displacement threshold DT used (also the RBD occupancy threshold).
    pub dt: u64,
    /// Distinct sequence numbers that arrived (duplicates excluded).
    pub received: u64,
    /// Arrivals of a number already seen (discarded).
    pub duplicates: u64,
    /// FD\[D\]: how many packets had displacement D = receive index − number
    /// (negative: early, positive: late), for |D| ≤ DT.
    pub fd: BTreeMap<i64, u64>,
    /// RD: packets discarded because |D| exceeded DT (the receive index is
    /// not advanced for them).
    pub beyond_dt: u64,
    /// RD: packets that arrived after the receive index had passed their
    /// number (already taken as lost); discarded.
    pub too_late: u64,
    /// RD: sequence numbers the receive index skipped because they were not
    /// in the look-ahead window or the buffer (taken as lost).
    pub declared_lost: u64,
    /// FB\[B\]: how many arrivals left the reorder buffer holding B packets.
    pub fb: BTreeMap<u64, u64>,
}

impl Rfc5236 {
    /// RD\[D\] = FD\[D\] / Σ FD.
    pub fn rd(&self) -> BTreeMap<i64, f64> {
        let total: u64 = self.fd.values().sum();
        self.fd
            .iter()
            .map(|(k, v)| (*k, *v as f64 / total.max(1) as f64))
            .collect()
    }
    /// RBD\[B\] = FB\[B\] / Σ FB.
    pub fn rbd(&self) -> BTreeMap<u64, f64> {
        let total: u64 = self.fb.values().sum();
        self.fb
            .iter()
            .map(|(k, v)| (*k, *v as f64 / total.max(1) as f64))
            .collect()
    }
    /// RD\[0\]: fraction of packets that arrived exactly in place.
    pub fn rd0(&self) -> f64 {
        self.rd().get(&0).copied().unwrap_or(0.0)
    }
    /// Mean buffer occupancy Σ B·RBD\[B\] (0 for an empty trace; a float
    /// sum over nothing is -0.0, which printed as "-0.000").
    pub fn rbd_mean(&self) -> f64 {
        self.rbd().iter().map(|(b, p)| *b as f64 * p).sum::<f64>() + 0.0
    }
    /// Add another sample's counts.
    pub fn merge(&mut self, o: &Rfc5236) {
        self.dt = self.dt.max(o.dt);
        self.received += o.received;
        self.duplicates += o.duplicates;
        self.beyond_dt += o.beyond_dt;
        self.too_late += o.too_late;
        self.declared_lost += o.declared_lost;
        for (k, v) in &o.fd {
            *self.fd.entry(*k).or_default() += v;
        }
        for (k, v) in &o.fb {
            *self.fb.entry(*k).or_default() += v;
        }
    }
}

/// The arrivals in order, with their insertion-ordered look-ahead window.
struct Window<'a> {
    rest: std::slice::Iter<'a, i64>,
    order: VecDeque<i64>,
    set: BTreeSet<i64>,
}

impl<'a> Window<'a> {
    fn new(arrivals: &'a [i64]) -> Self {
        Window {
            rest: arrivals.iter(),
            order: VecDeque::new(),
            set: BTreeSet::new(),
        }
    }
    /// Next arrival that `skip` does not reject; `skip` sees the number and
    /// whether it is already in the window.
    fn pull(&mut self, mut skip: impl FnMut(i64, bool) -> bool) -> Option<i64> {
        let set = &self.set;
        self.rest
            .by_ref()
            .copied()
            .find(|&s| !skip(s, set.contains(&s)))
    }
    fn push(&mut self, s: i64) {
        self.order.push_back(s);
        self.set.insert(s);
    }
    fn pop(&mut self) -> Option<i64> {
        let sequence = self.order.pop_front()?;
        self.set.remove(&sequence);
        Some(sequence)
    }
    fn min(&self) -> Option<i64> {
        self.set.first().copied()
    }
}

/// Compute RD and RBD with displacement threshold `dt` (used as the RBD
/// occupancy threshold too) over an arrival sequence of sender-order
/// numbers that increase by one per packet (use [`ranks`] for TCP byte
/// offsets). The receive index starts at the smallest number that arrived
/// (the RFC's start at 1 for numbers from 1).
pub fn rfc5236(arrivals: &[i64], dt: u64) -> Rfc5236 {
    let mut metrics = Rfc5236 {
        dt,
        ..Default::default()
    };
    let mut seen = HashSet::with_capacity(arrivals.len());
    for &a in arrivals {
        if !seen.insert(a) {
            metrics.duplicates += 1;
        }
    }
    metrics.received = seen.len() as u64;
    rd(arrivals, dt, &mut metrics);
    rbd(arrivals, dt, &mut metrics);
    metrics
}

/// Window size DT + 1, bounded so that a huge DT does not overflow.
fn window_len(dt: u64) -> usize {
    usize::try_from(dt).unwrap_or(usize::MAX).saturating_add(1)
}

/// Reorder Density (RFC 5236 algorithm for RD).
fn rd(arrivals: &[i64], dt: u64, m: &mut Rfc5236) {
    let mut window = Window::new(arrivals);
    let mut buffer: BTreeSet<i64> = BTreeSet::new();
    let mut seen: HashSet<i64> = HashSet::new();
    // Step 1: the first DT + 1 distinct numbers fill the window.
    while window.order.len() < window_len(dt) {
        match window.pull(|sequence, _| !seen.insert(sequence)) {
            Some(sequence) => window.push(sequence),
            None => break,
        }
    }
    // RI starts at the first number sent (the RFC's 1), taken as the
    // smallest number that arrived: a first packet that arrives late, beyond
    // the first window, is then declared lost and too late, as in the RFC.
    let Some(mut expected) = arrivals.iter().copied().min() else {
        return;
    };
    // Step 2.
    while !window.order.is_empty() {
        if window.set.contains(&expected) || buffer.contains(&expected) {
            let sequence = window.pop().expect("window is not empty");
            let displacement = expected - sequence;
            if displacement.unsigned_abs() <= dt {
                *m.fd.entry(displacement).or_default() += 1;
                buffer.remove(&expected);
                if displacement < 0 {
                    buffer.insert(sequence);
                }
                expected += 1;
            } else {
                m.beyond_dt += 1;
            }
            // Next arrival that is neither a duplicate nor already passed.
            let next = window.pull(|sequence, in_window| {
                if !seen.insert(sequence) || in_window || buffer.contains(&sequence) {
                    return true;
                }
                if sequence < expected {
                    m.too_late += 1;
                    return true;
                }
                false
            });
            if let Some(sequence) = next {
                window.push(sequence);
            }
        } else {
            // The packet numbered RI is not in the window or the buffer:
            // lost. Go on with the smallest number still to be placed.
            let window_min = window.min().expect("window is not empty");
            let lowest = buffer.first().map_or(window_min, |&b| b.min(window_min));
            if expected < lowest {
                m.declared_lost += (lowest - expected) as u64;
                expected = lowest;
            } else if buffer.last().is_none_or(|&b| b < expected)
                && window.set.last().is_none_or(|&x| x < expected)
            {
                // Every number left lies below RI, so RI would be raised
                // for ever. Not reached in exhaustive checks of short
                // sequences; kept so that no input can make this loop spin:
                // the front packet is placed as late.
                let sequence = window.pop().expect("window is not empty");
                let displacement = expected - sequence;
                if displacement.unsigned_abs() <= dt {
                    *m.fd.entry(displacement).or_default() += 1;
                } else {
                    m.beyond_dt += 1;
                }
            } else {
                m.declared_lost += 1;
                expected += 1;
            }
        }
    }
}

/// Reorder Buffer-occupancy Density (RFC 5236 algorithm for RBD).
fn rbd(arrivals: &[i64], bt: u64, m: &mut Rfc5236) {
    let mut window = Window::new(arrivals);
    let mut buffer: BTreeSet<i64> = BTreeSet::new();
    let mut seen: HashSet<i64> = HashSet::new();
    while window.order.len() < window_len(bt) {
        match window.pull(|sequence, _| !seen.insert(sequence)) {
            Some(sequence) => window.push(sequence),
            None => break,
        }
    }
    while let Some(mut earliest) = window.min() {
        // E: the smallest number in the window (numbers not in it are lost).
        let sequence = window.pop().expect("window is not empty");
        if sequence == earliest {
            // Release buffered packets while the smallest outstanding number
            // (window and buffer) is in the buffer.
            while let Some(&buffered) = buffer.first() {
                if window
                    .min()
                    .is_some_and(|next_arrival| next_arrival < buffered)
                {
                    break;
                }
                buffer.remove(&buffered);
            }
            earliest = window.min().unwrap_or(sequence);
        } else {
            buffer.insert(sequence);
        }
        *m.fb.entry(buffer.len() as u64).or_default() += 1;
        // Next arrival that is not a duplicate and not at or below E.
        let next = window.pull(|next_arrival, in_window| {
            !seen.insert(next_arrival)
                || next_arrival <= earliest
                || in_window
                || buffer.contains(&next_arrival)
        });
        if let Some(next_arrival) = next {
            window.push(next_arrival);
        }
    }
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

/// RFC 4737 reordered singletons counted on a live stream of TCP segments
/// (or any flow with sequence numbers and lengths), per flow, with bounded
/// state: a segment is reordered when its first sequence number is below
/// the flow's `NextExp`, the end (`seq + len`) of the furthest segment seen
/// (serial arithmetic in `space`). Duplicates cannot be told from late
/// segments without remembering every segment, so a retransmission counts
/// as reordered too; compare two points of one stream with the same meter
/// (e.g. before and after a sorter), where both see the same
/// retransmissions. At most `max_flows` flows are followed; segments of
/// further flows are counted in `untracked`.
#[derive(Clone, Debug)]
pub struct ReorderMeter {
    space: crate::seq::SeqSpace,
    next_exp: std::collections::HashMap<crate::key::FlowKey, u32>,
    max_flows: usize,
    /// Segments observed (of followed flows).
    pub received: u64,
    /// Of those, reordered singletons.
    pub reordered: u64,
    /// Segments of flows beyond `max_flows`.
    pub untracked: u64,
}

impl ReorderMeter {
    /// A meter following at most `max_flows` flows.
    pub fn new(space: crate::seq::SeqSpace, max_flows: usize) -> Self {
        ReorderMeter {
            space,
            next_exp: std::collections::HashMap::new(),
            max_flows,
            received: 0,
            reordered: 0,
            untracked: 0,
        }
    }

    /// Observe one segment of flow `key`.
    pub fn observe(&mut self, key: crate::key::FlowKey, seq: u32, len: u32) {
        let space = self.space;
        let end = space.add(seq, len.max(1));
        let expected = match self.next_exp.get_mut(&key) {
            Some(expected) => expected,
            None => {
                if self.next_exp.len() >= self.max_flows {
                    self.untracked += 1;
                    return;
                }
                self.next_exp.insert(key, end);
                self.received += 1;
                return;
            }
        };
        self.received += 1;
        if space.lt(seq, *expected) {
            self.reordered += 1;
        } else {
            *expected = end;
        }
        if space.lt(*expected, end) {
            *expected = end;
        }
    }

    /// Reordered ratio (0 without segments).
    pub fn ratio(&self) -> f64 {
        if self.received == 0 {
            0.0
        } else {
            self.reordered as f64 / self.received as f64
        }
    }

    /// Flows followed.
    pub fn flows(&self) -> usize {
        self.next_exp.len()
    }
}
