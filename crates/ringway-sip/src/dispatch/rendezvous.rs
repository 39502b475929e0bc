//! Rendezvous (highest random weight) hashing: a key goes to the node with
//! the highest `weight(key, node)`. When a node is out, only the keys it
//! held move (each to its own runner-up, so they spread over the others);
//! no other key moves, unlike `hash % n` (Kamailio's dispatcher and
//! SIPhon remap most keys when the set changes) or linear probing to the
//! next node (Kamailio's dispatcher hands a dead node's whole share to one
//! neighbour, kamailio#2361).
//!
//! The weight is [`Hash64`] (fixed: seed, word mixing and finaliser are
//! spelled out in this crate, not std's `DefaultHasher`, which may change
//! between Rust releases) of the node's identity and the key; a test pins
//! its values, so every dispatcher build maps keys alike.

use crate::hash::Hash64;

/// Seed of the rendezvous weights (changing it moves every key).
const SEED: u64 = 0x4852_5721; // "HRW!"

/// The weight of `key` on the node whose identity is `node` (e.g. its
/// `ip:port` text).
pub fn weight(node: &str, key: &[u8]) -> u64 {
    Hash64::new(SEED).str(node).bytes(key).finish()
}

/// The node for `key` among `nodes` (identity, eligible): the eligible
/// node of highest weight, ties to the lower index. `None` if no node is
/// eligible.
pub fn choose<'n>(key: &[u8], nodes: impl IntoIterator<Item = (&'n str, bool)>) -> Option<usize> {
    let mut best: Option<(u64, usize)> = None;
    for (index, (node, eligible)) in nodes.into_iter().enumerate() {
        if !eligible {
            continue;
        }
        let w = weight(node, key);
        if best.is_none_or(|(top, _)| w > top) {
            best = Some((w, index));
        }
    }
    best.map(|(_, index)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: [&str; 3] = ["127.0.0.11:5060", "127.0.0.12:5060", "127.0.0.13:5060"];

    fn pick(key: &str, alive: [bool; 3]) -> Option<usize> {
        choose(key.as_bytes(), NODES.iter().copied().zip(alive))
    }

    #[test]
    fn weights_are_pinned() {
        // The function is part of the wire behaviour: a change moves calls.
        assert_eq!(weight("127.0.0.11:5060", b"call-1"), 0x4d1b_3830_21fe_5f41);
        assert_eq!(pick("call-1", [true; 3]), Some(1));
        assert_eq!(choose(b"x", [("a", false)]), None);
    }

    #[test]
    fn a_dead_node_moves_its_share_only_and_spreads_it() {
        let keys: Vec<String> = (0..3000).map(|i| format!("{i}-1234@192.0.2.1")).collect();
        let before: Vec<usize> = keys.iter().map(|k| pick(k, [true; 3]).unwrap()).collect();
        for dead in 0..3 {
            let mut alive = [true; 3];
            alive[dead] = false;
            let mut moved_to = [0usize; 3];
            for (k, &was) in keys.iter().zip(&before) {
                let now = pick(k, alive).unwrap();
                if was == dead {
                    moved_to[now] += 1;
                } else {
                    assert_eq!(now, was, "{k} moved off a live node");
                }
            }
            let share = before.iter().filter(|&&n| n == dead).count();
            assert!((800..1200).contains(&share), "share {share} of 3000");
            // The dead node's keys split over both survivors (not one
            // neighbour taking them all).
            for (node, &n) in moved_to.iter().enumerate() {
                if node != dead {
                    assert!(n > share / 4, "{moved_to:?}");
                }
            }
        }
    }
}
