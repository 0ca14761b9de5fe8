//! The sweep of edges to deleted nodes (IP-DiskANN's background cleanup).
//!
//! A delete repairs the in-neighbours its search finds; an in-edge it
//! misses still points at the tombstone. A tombstone's slot may only be
//! taken by an insert once no live node points at it (else that edge would
//! lead to an unrelated vector), so a deleted slot waits in `pending`.
//!
//! A sweep round takes every pending tombstone, then looks at the page file
//! a slice of blocks at a time, each slice after an update: every live node
//! with an edge to a tombstone drops it and takes up to 3 of that
//! tombstone's live neighbours, pruned when its list overflows (a `Repair`
//! patch, logged like any update). When the round has looked at every
//! block, its tombstones' slots are free: no live node points at them, and
//! no update adds an edge to a tombstone (their candidates are live nodes).
//! Deletes during a round wait for the next one.

use super::{InPlace, Node, Reader, REPLACEMENTS};
use crate::index::graph::GraphOpen;
use crate::update::wal::{Patch, PatchAction};
use crate::{Error, Result};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

/// Blocks the sweep looks at after each update while a round runs.
pub const SWEEP_BLOCKS: u64 = 64;

/// One slice of a sweep round: its repairs, and where the next starts.
pub struct SweepStep {
    /// The blocks it rewrites (`None`: nothing to repair in the slice).
    pub patch: Option<Patch>,
    /// This slice starts a round.
    pub starts: bool,
    /// The first block of the next slice (the page file's block count:
    /// the round is done).
    pub next: u64,
    /// The page file's blocks when the slice was planned.
    pub blocks: u64,
}

impl InPlace {
    /// Whether tombstones wait for a sweep (or a round runs).
    pub fn sweeping(&self) -> bool {
        !self.round.is_empty() || !self.pending.is_empty()
    }

    /// Tombstones whose slots inserts may take now.
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }

    /// The next slice of up to `blocks` blocks (`None`: no tombstone waits).
    pub fn plan_sweep(&self, open: &GraphOpen, blocks: u64) -> Result<Option<SweepStep>> {
        if !self.sweeping() {
            return Ok(None);
        }
        let g = &open.g;
        let spec = &open.manifest.spec;
        let geo = g.geometry();
        let n = g.nodes();
        let starts = self.round.is_empty();
        let from = if starts { 0 } else { self.sweep_at };
        let to = (from + blocks.max(1)).min(geo.n_blocks);
        let rpb = geo.records_per_block as u64;
        let dead = |u: u32| g.external(u) < 0;
        let mut reader = Reader::open(g)?;
        let pages = g.pages_path();
        // Each tombstone met: its first live neighbours (read once).
        let mut heirs: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut patched: BTreeMap<u32, Node> = BTreeMap::new();
        for b in from..to {
            let img = reader.block(&geo, b)?;
            crate::format::page::verify_block(&img, b, &geo)
                .map_err(|m| Error::corrupt(&pages, m))?;
            for slot in 0..geo.records_per_block {
                let u = b * rpb + slot as u64;
                if u >= n as u64 {
                    break;
                }
                let u = u as u32;
                if dead(u) {
                    continue;
                }
                let rec = geo
                    .decode(&img, slot)
                    .map_err(|m| Error::corrupt(&pages, format!("node {u}: {m}")))?;
                if !rec.neighbours.iter().any(|&t| dead(t)) {
                    continue;
                }
                let mut list: Vec<u32> = rec
                    .neighbours
                    .iter()
                    .copied()
                    .filter(|&t| !dead(t))
                    .collect();
                for &t in rec.neighbours.iter().filter(|&&t| dead(t)) {
                    let got = match heirs.entry(t) {
                        Entry::Occupied(e) => e.into_mut(),
                        Entry::Vacant(e) => e.insert(
                            reader
                                .node(t)?
                                .list
                                .into_iter()
                                .filter(|&c| !dead(c))
                                .take(REPLACEMENTS)
                                .collect(),
                        ),
                    };
                    for &c in got.iter() {
                        if c != u && !list.contains(&c) {
                            list.push(c);
                        }
                    }
                }
                let vector = crate::update::wal::decode_vectors(g.manifest().dtype, rec.vector);
                if list.len() > spec.r {
                    let known = HashMap::from([(u, vector.as_slice())]);
                    list = self.prune_list(g, u, &vector, &list, &known, spec)?;
                }
                patched.insert(u, Node { vector, list });
            }
        }
        let patch = if patched.is_empty() {
            None
        } else {
            Some(Patch {
                action: PatchAction::Repair,
                internal: u32::MAX,
                external: u64::MAX,
                dim: 0,
                dtype: crate::elem::DType::F32,
                vector: Vec::new(),
                block_size: geo.block_size as u32,
                blocks: self.blocks(g, &mut reader, &patched, n)?,
            })
        };
        Ok(Some(SweepStep {
            patch,
            starts,
            next: to,
            blocks: geo.n_blocks,
        }))
    }

    /// Moves the sweep past `step` (its patch applied): a round's start
    /// takes the pending tombstones; its end frees their slots.
    pub fn advance_sweep(&mut self, step: &SweepStep) {
        if step.starts {
            self.round = std::mem::take(&mut self.pending);
        }
        self.sweep_at = step.next;
        if step.next >= step.blocks {
            self.free.append(&mut self.round);
            self.sweep_at = 0;
        }
    }
}
