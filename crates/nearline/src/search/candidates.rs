//! The bounded, sorted candidate list of a best-first search.

/// One candidate: distance, id and whether it has been expanded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub dist: f32,
    pub id: u32,
    pub expanded: bool,
}

/// A list of at most `capacity` candidates sorted by distance (then id).
#[derive(Debug, Default)]
pub struct CandidateList {
    items: Vec<Candidate>,
    capacity: usize,
    /// No unexpanded candidate sits before this position.
    cursor: usize,
}

impl CandidateList {
    /// Empties the list and sets its capacity.
    pub fn reset(&mut self, capacity: usize) {
        self.items.clear();
        self.items.reserve(capacity + 1);
        self.capacity = capacity.max(1);
        self.cursor = 0;
    }

    /// Inserts a candidate unless the list is full of closer ones.
    /// Returns whether it was inserted.
    #[inline]
    pub fn insert(&mut self, dist: f32, id: u32) -> bool {
        if self.items.len() == self.capacity {
            match self.items.last() {
                Some(last) if (dist, id) >= (last.dist, last.id) => return false,
                _ => {}
            }
        }
        let pos = self.items.partition_point(|c| (c.dist, c.id) < (dist, id));
        self.items.insert(
            pos,
            Candidate {
                dist,
                id,
                expanded: false,
            },
        );
        if self.items.len() > self.capacity {
            self.items.pop();
        }
        if pos < self.cursor {
            self.cursor = pos;
        }
        true
    }

    /// Inserts a candidate like [`CandidateList::insert`] and returns the
    /// candidate that is no longer in the list because of it: the one
    /// pushed off the end, or the new one when the list is full of closer
    /// ones (range search keeps these in its kicked set).
    #[inline]
    pub fn insert_kick(&mut self, dist: f32, id: u32) -> Option<Candidate> {
        let full = self.items.len() == self.capacity;
        let last = self.items.last().copied();
        if !self.insert(dist, id) {
            return Some(Candidate {
                dist,
                id,
                expanded: false,
            });
        }
        if full {
            last
        } else {
            None
        }
    }

    /// Raises the capacity to `capacity` (never lowers it).
    pub fn grow(&mut self, capacity: usize) {
        if capacity > self.capacity {
            self.items.reserve(capacity + 1 - self.items.len());
            self.capacity = capacity;
        }
    }

    /// The list's capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Marks the candidate `(dist, id)` expanded if it is in the list
    /// (a node expanded some other way, so it is never read for itself).
    #[inline]
    pub fn mark_expanded(&mut self, dist: f32, id: u32) {
        let pos = self.items.partition_point(|c| (c.dist, c.id) < (dist, id));
        if let Some(c) = self.items.get_mut(pos) {
            if c.id == id && c.dist == dist {
                c.expanded = true;
            }
        }
    }

    /// Moves up to `w` closest unexpanded candidates into `out`, marking them expanded.
    pub fn take_unexpanded(&mut self, w: usize, out: &mut Vec<u32>) {
        let mut i = self.cursor;
        while i < self.items.len() && out.len() < w {
            let c = &mut self.items[i];
            if !c.expanded {
                c.expanded = true;
                out.push(c.id);
            }
            i += 1;
        }
        while self.cursor < self.items.len() && self.items[self.cursor].expanded {
            self.cursor += 1;
        }
    }

    /// Takes the closest unexpanded candidate, marking it expanded.
    #[inline]
    pub fn take_best(&mut self) -> Option<Candidate> {
        while self.cursor < self.items.len() && self.items[self.cursor].expanded {
            self.cursor += 1;
        }
        let c = self.items.get_mut(self.cursor)?;
        c.expanded = true;
        let taken = *c;
        self.cursor += 1;
        Some(taken)
    }

    /// Whether an unexpanded candidate remains.
    pub fn has_unexpanded(&self) -> bool {
        self.items[self.cursor.min(self.items.len())..]
            .iter()
            .any(|c| !c.expanded)
    }

    /// Whether the candidate `(dist, id)` is in the list and not expanded.
    #[inline]
    pub fn is_unexpanded(&self, dist: f32, id: u32) -> bool {
        let pos = self.items.partition_point(|c| (c.dist, c.id) < (dist, id));
        self.items
            .get(pos)
            .is_some_and(|c| c.id == id && c.dist == dist && !c.expanded)
    }

    /// Whether the candidate `(dist, id)` is still in the list.
    #[inline]
    pub fn contains(&self, dist: f32, id: u32) -> bool {
        let pos = self.items.partition_point(|c| (c.dist, c.id) < (dist, id));
        self.items
            .get(pos)
            .is_some_and(|c| c.id == id && c.dist == dist)
    }

    /// Whether the first `n` positions of the list (all of it when shorter)
    /// have been taken for expansion.
    #[inline]
    pub fn prefix_taken(&self, n: usize) -> bool {
        self.items.iter().take(n).all(|c| c.expanded)
    }

    /// The candidates, closest first.
    pub fn items(&self) -> &[Candidate] {
        &self.items
    }
}

/// Candidates that left (or never entered) a bounded list unexpanded: a
/// range search's kicked set P, brought back when the list grows.
#[derive(Debug, Default)]
pub struct KickedSet {
    kicked: Vec<Candidate>,
}

impl KickedSet {
    /// Forgets everything (a new query).
    pub fn clear(&mut self) {
        self.kicked.clear();
    }

    /// Keeps a candidate that left (or never entered) the list, unless it
    /// was already expanded.
    #[inline]
    pub fn kicked(&mut self, c: Candidate) {
        if !c.expanded {
            self.kicked.push(c);
        }
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.kicked.capacity() * std::mem::size_of::<Candidate>()
    }

    /// The candidates kept (a range search sorts and drains them).
    pub fn items_mut(&mut self) -> &mut Vec<Candidate> {
        &mut self.kicked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kicked_candidates_and_growth() {
        let mut c = CandidateList::default();
        c.reset(2);
        assert_eq!(c.insert_kick(2.0, 2), None);
        assert_eq!(c.insert_kick(3.0, 3), None);
        // Full: a closer one pushes 3 off; a farther one is itself kicked.
        assert_eq!(c.insert_kick(1.0, 1).map(|k| k.id), Some(3));
        assert_eq!(c.insert_kick(9.0, 9).map(|k| k.id), Some(9));
        c.mark_expanded(2.0, 2);
        c.mark_expanded(1.0, 7); // not in the list: nothing changes
        assert_eq!(c.take_best().map(|k| k.id), Some(1));
        assert!(!c.has_unexpanded());
        c.grow(4);
        assert_eq!(c.capacity(), 4);
        assert_eq!(c.insert_kick(3.0, 3), None);
        assert_eq!(c.items().len(), 3);
    }

    proptest! {
        #[test]
        fn keeps_the_closest_sorted(ds in proptest::collection::vec(0u32..1000, 1..200), cap in 1usize..50) {
            let mut l = CandidateList::default();
            l.reset(cap);
            for (i, &d) in ds.iter().enumerate() {
                l.insert(d as f32, i as u32);
            }
            let mut want: Vec<(u32, u32)> = ds.iter().enumerate().map(|(i, &d)| (d, i as u32)).collect();
            want.sort();
            want.truncate(cap);
            let got: Vec<(u32, u32)> = l.items().iter().map(|c| (c.dist as u32, c.id)).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn take_unexpanded_walks_in_order() {
        let mut l = CandidateList::default();
        l.reset(10);
        for (d, id) in [(3.0, 3), (1.0, 1), (2.0, 2), (5.0, 5)] {
            l.insert(d, id);
        }
        let mut out = Vec::new();
        l.take_unexpanded(2, &mut out);
        assert_eq!(out, vec![1, 2]);
        l.insert(0.5, 9);
        out.clear();
        l.take_unexpanded(2, &mut out);
        assert_eq!(out, vec![9, 3]);
        out.clear();
        l.take_unexpanded(5, &mut out);
        assert_eq!(out, vec![5]);
        assert!(!l.has_unexpanded());
    }

    #[test]
    fn contains_and_prefix_taken() {
        let mut l = CandidateList::default();
        l.reset(3);
        for (d, id) in [(3.0, 3), (1.0, 1), (2.0, 2)] {
            l.insert(d, id);
        }
        assert!(l.contains(1.0, 1) && l.contains(3.0, 3));
        assert!(!l.contains(1.0, 2) && !l.contains(9.0, 9));
        assert!(!l.prefix_taken(1));
        let mut out = Vec::new();
        l.take_unexpanded(2, &mut out);
        assert!(l.prefix_taken(2) && !l.prefix_taken(3));
        // A closer candidate pushes (3.0, 3) out of the full list.
        l.insert(0.5, 7);
        assert!(!l.contains(3.0, 3) && l.contains(0.5, 7));
        assert!(!l.prefix_taken(1));
        out.clear();
        l.take_unexpanded(5, &mut out);
        assert!(l.prefix_taken(5));
    }

    #[test]
    fn take_best_walks_in_order() {
        let mut l = CandidateList::default();
        l.reset(10);
        for (d, id) in [(3.0, 3), (1.0, 1), (2.0, 2)] {
            l.insert(d, id);
        }
        assert_eq!(l.take_best().map(|c| (c.dist, c.id)), Some((1.0, 1)));
        l.insert(0.5, 9);
        assert_eq!(l.take_best().map(|c| c.id), Some(9));
        assert_eq!(l.take_best().map(|c| c.id), Some(2));
        assert_eq!(l.take_best().map(|c| c.id), Some(3));
        assert!(l.take_best().is_none());
        assert!(!l.has_unexpanded());
    }
}
