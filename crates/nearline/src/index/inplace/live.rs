//! The live ids of an index updated in place: its live internal ids sorted
//! by external id, looked up by binary search through the graph's id array
//! (which the index holds anyway). Four bytes a node, where a hash map of
//! external to internal ids takes about twenty: the budget's room goes to
//! the cache and the searches' scratch instead (on wordnet at 20% of the raw
//! bytes, a map left the searches too little scratch, so each borrowed from
//! the cache).
//!
//! An insert or delete moves the entries after its place (a `memmove` of
//! up to 4 bytes a node: well under a millisecond at a million nodes, next
//! to an update's search and prunes).

/// Live internal ids sorted by their external ids, and the next automatic
/// id.
#[derive(Debug, Default)]
pub struct LiveIds {
    sorted: Vec<u32>,
    next_auto: u64,
}

impl LiveIds {
    /// The live nodes of an index whose external ids are `ext` (`u64::MAX`:
    /// a tombstone), automatic ids from `next_auto` on (raised above every
    /// live id).
    pub fn new(ext: &[u64], next_auto: u64) -> LiveIds {
        let mut sorted: Vec<u32> = (0..ext.len() as u32)
            .filter(|&i| ext[i as usize] != u64::MAX)
            .collect();
        sorted.sort_unstable_by_key(|&i| ext[i as usize]);
        let above = sorted
            .last()
            .map_or(0, |&i| ext[i as usize].saturating_add(1));
        LiveIds {
            sorted,
            next_auto: next_auto.max(above),
        }
    }

    /// Where `id` is (`Ok`) or would go (`Err`) among the sorted entries.
    fn find(&self, ext: &[u64], id: u64) -> Result<usize, usize> {
        self.sorted.binary_search_by_key(&id, |&i| ext[i as usize])
    }

    /// The internal id of live `id`.
    pub fn get(&self, ext: &[u64], id: u64) -> Option<u32> {
        self.find(ext, id).ok().map(|at| self.sorted[at])
    }

    /// Adds `internal`, whose external id `ext[internal]` is not live yet
    /// (the entries grow by an eighth when full: see [`bytes_with`]).
    ///
    /// [`bytes_with`]: LiveIds::bytes_with
    pub fn insert(&mut self, ext: &[u64], internal: u32) {
        let id = ext[internal as usize];
        self.next_auto = self.next_auto.max(id.saturating_add(1));
        if let Err(at) = self.find(ext, id) {
            let (len, cap) = (self.sorted.len(), self.sorted.capacity());
            if len == cap {
                self.sorted.reserve_exact(grown(cap, len + 1) - len);
            }
            self.sorted.insert(at, internal);
        }
    }

    /// Removes live `id` (its entry found through `ext`, before the caller
    /// marks the node a tombstone); its internal id, if it was live.
    pub fn remove(&mut self, ext: &[u64], id: u64) -> Option<u32> {
        let at = self.find(ext, id).ok()?;
        Some(self.sorted.remove(at))
    }

    /// Live ids.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// The next automatic id: above every id seen.
    pub fn next_auto(&self) -> u64 {
        self.next_auto
    }

    /// Raises the next automatic id to at least `at`.
    pub fn raise_next_auto(&mut self, at: u64) {
        self.next_auto = self.next_auto.max(at);
    }

    /// Every live external id, ascending.
    pub fn ids(&self, ext: &[u64]) -> Vec<u64> {
        self.sorted.iter().map(|&i| ext[i as usize]).collect()
    }

    /// Resident bytes.
    pub fn memory_bytes(&self) -> u64 {
        Self::bytes_for(self.sorted.capacity())
    }

    /// Resident bytes once `more` ids are added.
    pub fn bytes_with(&self, more: usize) -> u64 {
        Self::bytes_for(grown(self.sorted.capacity(), self.sorted.len() + more))
    }

    /// Bytes that making room for `more` ids holds twice for a moment
    /// (the array is copied when it runs out of capacity).
    pub fn moving_bytes_with(&self, more: usize) -> u64 {
        if self.sorted.len() + more > self.sorted.capacity() {
            self.memory_bytes()
        } else {
            0
        }
    }

    /// Resident bytes with room for `capacity` ids.
    pub fn bytes_for(capacity: usize) -> u64 {
        capacity as u64 * 4
    }
}

/// The capacity entries of capacity `cap` have once they hold `need`.
fn grown(cap: usize, need: usize) -> usize {
    if need <= cap {
        cap
    } else {
        need.max(cap + (cap / 8).max(64))
    }
}

#[cfg(test)]
mod tests {
    use super::LiveIds;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Against a map: inserts, removes and lookups through an id array
        /// that the caller changes as an in-place index does.
        #[test]
        fn matches_a_map(ops in proptest::collection::vec((0u8..3, 0u64..40), 1..200)) {
            let mut ext: Vec<u64> = vec![u64::MAX; 8];
            ext[3] = 7;
            ext[5] = 2;
            let mut live = LiveIds::new(&ext, 0);
            let mut map: BTreeMap<u64, u32> = BTreeMap::from([(7, 3), (2, 5)]);
            prop_assert_eq!(live.next_auto(), 8);
            for (op, id) in ops {
                match op {
                    0 if !map.contains_key(&id) => {
                        let slot = ext.len() as u32;
                        ext.push(id);
                        live.insert(&ext, slot);
                        map.insert(id, slot);
                    }
                    1 => {
                        let got = live.remove(&ext, id);
                        if let Some(i) = got {
                            ext[i as usize] = u64::MAX;
                        }
                        prop_assert_eq!(got, map.remove(&id));
                    }
                    _ => prop_assert_eq!(live.get(&ext, id), map.get(&id).copied()),
                }
                prop_assert_eq!(live.len(), map.len());
            }
            prop_assert_eq!(live.ids(&ext), map.keys().copied().collect::<Vec<_>>());
            prop_assert!(live.next_auto() > map.keys().copied().max().unwrap_or(0));
        }
    }
}
