//! A batch's *waves*: the k-th record of each key goes into wave k, so a
//! wave has at most one record per order and the waves follow offset order.
//! The transaction applies the open records wave after wave
//! (`worker/apply.rs`), and the effects outside the database are delivered
//! in the same waves before it opens (`worker/outside.rs`).

use std::collections::HashMap;

/// The waves of `open` (positions in offset order): the k-th record of
/// each key goes into wave k.
pub(super) fn waves<K: Eq + std::hash::Hash>(
    open: &[usize],
    keys: &HashMap<usize, K>,
) -> Vec<Vec<usize>> {
    let mut seen: HashMap<&K, usize> = HashMap::new();
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for &index in open {
        let k = seen.entry(&keys[&index]).or_default();
        if *k == waves.len() {
            waves.push(Vec::new());
        }
        waves[*k].push(index);
        *k += 1;
    }
    waves
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wave_holds_one_record_per_key_and_waves_follow_offset_order() {
        let keys: HashMap<usize, String> =
            [(0, "a"), (1, "a"), (2, "b"), (3, "a"), (5, "c"), (6, "b")]
                .into_iter()
                .map(|(i, k)| (i, k.to_string()))
                .collect();
        assert_eq!(
            waves(&[0, 1, 2, 3, 5, 6], &keys),
            vec![vec![0, 2, 5], vec![1, 6], vec![3]]
        );
        assert!(waves(&[], &keys).is_empty());
    }
}
