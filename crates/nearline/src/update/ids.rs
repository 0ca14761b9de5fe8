//! The id tracker every mutable index kind keeps: which external ids are
//! live and the internal handle each one has (a partition index's vector
//! slot, a graph delta's node), the next automatic id, and the one set of
//! rules an insert's rows and ids are checked by.
//!
//! The rules, the same for both index kinds (and the messages a user
//! sees):
//! - an insert holds whole rows of the index's dimension, finite, whose
//!   squared norms float32 distances can hold;
//! - given ids are as many as the rows, unique within the insert, not live,
//!   and within the signed 64-bit range (the Python API's `int64` arrays);
//! - automatic ids continue above every id the index has seen (so a
//!   deleted id is never handed out again by itself), skip any id that is
//!   live elsewhere (a graph index's disk nodes), and stop at `2**63 - 1`.
//!
//! A tracker does not know what else is live: an index kind with ids
//! kept elsewhere (a graph index's disk nodes, in its id section) passes
//! `also_live` to [`IdTracker::resolve_insert`].

use crate::{Error, Result};
use std::collections::{HashMap, HashSet};

/// The largest id an index stores.
pub const MAX_ID: u64 = i64::MAX as u64;

/// Checks that `vectors` holds whole rows of `dim` values (at least one),
/// finite and within the norm float32 distances can hold. Returns the
/// number of rows.
pub fn check_insert_rows(vectors: &[f32], dim: usize) -> Result<usize> {
    if dim == 0 || vectors.is_empty() || !vectors.len().is_multiple_of(dim) {
        return Err(Error::arg(format!(
            "vectors hold {} values: expected a positive multiple of the index's dimension {dim}",
            vectors.len()
        )));
    }
    crate::distance::check_rows(vectors, "vectors", dim)?;
    Ok(vectors.len() / dim)
}

/// Live external ids and their internal handles, and the next automatic id.
#[derive(Debug, Clone, Default)]
pub struct IdTracker {
    by_ext: HashMap<u64, u32>,
    next_auto: u64,
}

impl IdTracker {
    /// A tracker of `live` ids whose automatic ids start at `next_auto`
    /// (raised above every id in `live`).
    pub fn new(live: HashMap<u64, u32>, next_auto: u64) -> IdTracker {
        let above = live
            .keys()
            .copied()
            .max()
            .map_or(0, |m| m.saturating_add(1));
        IdTracker {
            by_ext: live,
            next_auto: next_auto.max(above),
        }
    }

    /// An empty tracker whose automatic ids start at `next_auto`.
    pub fn empty(next_auto: u64) -> IdTracker {
        IdTracker {
            by_ext: HashMap::new(),
            next_auto,
        }
    }

    /// The internal handle of a live id.
    #[inline]
    pub fn get(&self, ext: u64) -> Option<u32> {
        self.by_ext.get(&ext).copied()
    }

    /// Whether `ext` is live here.
    #[inline]
    pub fn contains(&self, ext: u64) -> bool {
        self.by_ext.contains_key(&ext)
    }

    /// Makes `ext` live with handle `internal` (and raises the next
    /// automatic id above it). Returns the handle it had, if it was live.
    pub fn insert(&mut self, ext: u64, internal: u32) -> Option<u32> {
        self.next_auto = self.next_auto.max(ext.saturating_add(1));
        self.by_ext.insert(ext, internal)
    }

    /// Ends `ext`'s life here; returns its handle if it was live.
    pub fn remove(&mut self, ext: u64) -> Option<u32> {
        self.by_ext.remove(&ext)
    }

    /// Live ids.
    pub fn len(&self) -> usize {
        self.by_ext.len()
    }

    /// Whether no id is live.
    pub fn is_empty(&self) -> bool {
        self.by_ext.is_empty()
    }

    /// Live ids and their handles, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.by_ext.iter().map(|(&e, &i)| (e, i))
    }

    /// The next automatic id: above every id seen.
    pub fn next_auto(&self) -> u64 {
        self.next_auto
    }

    /// Raises the next automatic id to at least `at`.
    pub fn raise_next_auto(&mut self, at: u64) {
        self.next_auto = self.next_auto.max(at);
    }

    /// Resident bytes: the map's table, a control byte and a 16-byte
    /// pair a bucket, buckets at 8/7 of its capacity.
    pub fn memory_bytes(&self) -> u64 {
        Self::bytes_for(self.by_ext.capacity())
    }

    /// Resident bytes of a map with room for `capacity` ids.
    pub fn bytes_for(capacity: usize) -> u64 {
        capacity as u64 * 17 * 8 / 7
    }

    /// Churn leaves deletion marks in the map that make it grow although
    /// it holds no more ids: rebuilds it at its size when it holds less
    /// than half its capacity.
    pub fn shrink_if_sparse(&mut self) {
        let live = self.by_ext.len();
        if self.by_ext.capacity() > 2 * live + 1024 {
            self.by_ext.shrink_to(live + live / 8);
        }
    }

    /// The ids of an insert of `n` rows: `ids` checked by the rules of the
    /// module documentation, or `n` automatic ones. `also_live` says
    /// whether an id is live outside this tracker. Nothing changes: the
    /// caller logs the insert, then applies it.
    pub fn resolve_insert(
        &self,
        ids: Option<&[u64]>,
        n: usize,
        also_live: impl Fn(u64) -> bool,
    ) -> Result<Vec<u64>> {
        let live = |e: u64| self.contains(e) || also_live(e);
        match ids {
            Some(ids) => {
                if ids.len() != n {
                    return Err(Error::arg(format!(
                        "{} ids given for {n} vectors",
                        ids.len()
                    )));
                }
                let mut seen = HashSet::with_capacity(n);
                for (r, &i) in ids.iter().enumerate() {
                    if i > MAX_ID {
                        return Err(Error::arg(format!(
                            "id {i} (row {r}) does not fit a signed 64-bit integer (ids end at \
                             2**63-1)"
                        )));
                    }
                    if !seen.insert(i) {
                        return Err(Error::arg(format!(
                            "id {i} (row {r}) appears more than once among the ids given"
                        )));
                    }
                    if live(i) {
                        return Err(Error::arg(format!(
                            "id {i} (row {r}) is already in the index: delete it first to replace \
                             its vector"
                        )));
                    }
                }
                Ok(ids.to_vec())
            }
            None => {
                let mut out = Vec::with_capacity(n);
                let mut next = self.next_auto;
                while out.len() < n {
                    if next > MAX_ID {
                        return Err(Error::arg(format!(
                            "no automatic ids are left for {n} vectors: they follow the largest \
                             id the index has seen ({}), and ids end at {MAX_ID}; pass ids \
                             explicitly",
                            self.next_auto.saturating_sub(1)
                        )));
                    }
                    if !live(next) {
                        out.push(next);
                    }
                    next += 1;
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<T: std::fmt::Debug>(r: Result<T>) -> String {
        match r {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn automatic_ids_continue_above_every_id_seen() {
        let mut t = IdTracker::new(HashMap::from([(5, 0), (9, 1)]), 0);
        assert_eq!(t.next_auto(), 10);
        assert_eq!(t.resolve_insert(None, 3, |_| false).unwrap(), [10, 11, 12]);
        // A deleted id is not handed out again.
        assert_eq!(t.remove(9), Some(1));
        assert_eq!(t.resolve_insert(None, 1, |_| false).unwrap(), [10]);
        // Ids live elsewhere are skipped.
        assert_eq!(
            t.resolve_insert(None, 2, |e| e == 10 || e == 12).unwrap(),
            [11, 13]
        );
        t.insert(100, 2);
        assert_eq!(t.next_auto(), 101);
        assert_eq!(t.get(100), Some(2));
        assert!(t.contains(5) && !t.contains(9));
    }

    #[test]
    fn given_ids_are_checked_before_anything_changes() {
        let t = IdTracker::new(HashMap::from([(7, 0)]), 0);
        assert!(msg(t.resolve_insert(Some(&[1, 2]), 3, |_| false)).contains("2 ids given for 3"));
        assert!(msg(t.resolve_insert(Some(&[1, 1]), 2, |_| false))
            .contains("id 1 (row 1) appears more than once"));
        assert!(msg(t.resolve_insert(Some(&[1, 7]), 2, |_| false))
            .contains("id 7 (row 1) is already in the index"));
        assert!(msg(t.resolve_insert(Some(&[3]), 1, |e| e == 3))
            .contains("id 3 (row 0) is already in the index"));
        assert!(msg(t.resolve_insert(Some(&[1 << 63]), 1, |_| false))
            .contains("does not fit a signed 64-bit integer"));
        assert_eq!(
            t.resolve_insert(Some(&[MAX_ID, 0]), 2, |_| false).unwrap(),
            [MAX_ID, 0]
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn automatic_ids_stop_at_the_largest_id() {
        let t = IdTracker::new(HashMap::from([(MAX_ID - 1, 0)]), 0);
        assert_eq!(t.resolve_insert(None, 1, |_| false).unwrap(), [MAX_ID]);
        assert!(msg(t.resolve_insert(None, 2, |_| false)).contains("no automatic ids are left"));
        let full = IdTracker::empty(MAX_ID + 1);
        assert!(msg(full.resolve_insert(None, 1, |_| false)).contains("no automatic ids are left"));
    }

    #[test]
    fn insert_rows_are_whole_finite_and_bounded() {
        assert_eq!(check_insert_rows(&[1.0, 2.0, 3.0, 4.0], 2).unwrap(), 2);
        assert!(msg(check_insert_rows(&[], 2)).contains("positive multiple"));
        assert!(msg(check_insert_rows(&[1.0, 2.0, 3.0], 2)).contains("positive multiple"));
        assert!(msg(check_insert_rows(&[1.0, f32::NAN], 2)).contains("non-finite"));
        assert!(msg(check_insert_rows(&[1.0, 1e30], 2)).contains("squared norm"));
    }
}
