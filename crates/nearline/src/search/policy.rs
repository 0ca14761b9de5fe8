//! Page policies: what the executor does with a page when it arrives.
//!
//! The executor reads a block because some candidates (its *targets*) live
//! there, then hands the verified page to a page policy in two steps:
//! [`PagePolicy::on_page`] does what the next reads depend on, then the
//! executor issues those reads (and, for the pipeline, hands them to the
//! kernel), then [`PagePolicy::deferred`] does the rest of the page's work
//! while they are in flight — Starling's I/O–compute pipeline (Algorithm 2),
//! expressed through the one executor loop. Each policy keeps its own
//! per-query state ([`PagePolicy::State`]).
//!
//! * [`TargetRecords`] (DiskANN): only the target records are used (exact
//!   distance, then their neighbours scored and inserted).
//! * [`Replicas`] (Gorgeous): the target records, and the neighbours'
//!   lists a replicated record carries are kept for the query, which then
//!   expands such a neighbour without reading it (see [`Query::in_memory`]).
//! * [`BlockSearch`] (Starling): every record of the page gets an exact
//!   distance (the result set is de-duplicated when the query ends); the
//!   targets are expanded at once, and the closest ⌈σ·(others)⌉ of the
//!   other records are expanded while the next reads are in flight. A node
//!   expanded this way is marked so it is never read or expanded again.

use super::query::{Env, Query};
use super::scorer::Scorer;
use crate::cache::Cache;
use crate::elem::Element;
use crate::layout::Layout;
use crate::{Error, Result};

/// What to do with an arrived page.
pub trait PagePolicy: Send + Sync {
    /// What the policy keeps per query slot.
    type State: Default + Send;

    /// Processes the verified page `page` of block `block`, read for the
    /// nodes `targets` of query `q`: the work the next reads depend on. Work
    /// left in `st` for [`PagePolicy::deferred`] runs after they are issued.
    fn on_page<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        st: &mut Self::State,
        block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()>;

    /// Whether `on_page` left work for [`PagePolicy::deferred`].
    #[inline]
    fn has_deferred(&self, _st: &Self::State) -> bool {
        false
    }

    /// The page's remaining work, run after the executor issued the reads
    /// `on_page` made possible (nothing by default).
    #[inline]
    fn deferred<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        _env: &Env<'_, T, L, S, C>,
        _q: &mut Query<T>,
        _st: &mut Self::State,
        _page: &[u8],
    ) -> Result<()> {
        Ok(())
    }

    /// Bytes a state holds.
    fn state_bytes(_st: &Self::State) -> usize {
        0
    }
}

/// DiskANN's page policy: use only the records the page was read for.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetRecords;

impl PagePolicy for TargetRecords {
    type State = ();

    #[inline]
    fn on_page<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        _st: &mut (),
        _block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        q.stats.page_records += env.layout.block_records(page) as u32;
        for &v in targets {
            let (_, slot) = env.layout.locate(v);
            let rec = q.record(env, page, v, slot)?;
            q.stats.used_bytes += geo.record_size as u64;
            q.stats.used_records += 1;
            q.expand_record(env, v, rec)?;
        }
        Ok(())
    }
}

/// Gorgeous' page policy on a graph-replicated layout.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replicas;

impl PagePolicy for Replicas {
    type State = ();

    #[inline]
    fn on_page<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        _st: &mut (),
        _block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        let n = env.data.n;
        q.stats.page_records += env.layout.block_records(page) as u32;
        for &v in targets {
            let (_, slot) = env.layout.locate(v);
            let rec = q.record(env, page, v, slot)?;
            q.stats.used_bytes += geo.record_size as u64;
            q.stats.used_records += 1;
            q.expand_record(env, v, rec)?;
            let corrupt = |m: String| {
                Error::corrupt(&env.data.pages_path, format!("record of node {v}: {m}"))
            };
            let packed = env.layout.packed(page, slot).map_err(corrupt)?;
            for i in 0..packed.len() {
                let (u, list) = packed.get(i).ok_or_else(|| {
                    corrupt(format!("packed list {i} has a degree above the bound"))
                })?;
                if u as usize >= n {
                    return Err(corrupt(format!(
                        "packs the list of node {u}, but the index has {n} nodes"
                    )));
                }
                // Only a listed, unexpanded neighbour can need its list: a
                // visited node never re-enters the list.
                let d = env.scorer.score(&q.table, u);
                if q.cand.is_unexpanded(d, u) {
                    q.load_list(u, list);
                }
            }
        }
        Ok(())
    }
}

/// Starling's block search with pruning ratio σ.
#[derive(Debug, Clone, Copy)]
pub struct BlockSearch {
    /// Fraction in (0, 1] of the page's other records to expand.
    pub sigma: f32,
}

/// Block search's per-query scratch.
#[derive(Debug, Default)]
pub struct BlockState {
    /// The nodes of the page.
    block_nodes: Vec<u32>,
    /// (exact distance, node, slot) of the page's other records.
    others: Vec<(f32, u32, u32)>,
    /// (node, slot) of co-located records to expand once the next reads
    /// are issued.
    deferred: Vec<(u32, u32)>,
}

impl PagePolicy for BlockSearch {
    type State = BlockState;

    fn on_page<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        st: &mut BlockState,
        block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        st.block_nodes.clear();
        env.layout.block_nodes(block, &mut st.block_nodes);
        let held = env.layout.block_records(page);
        if held != st.block_nodes.len() {
            return Err(Error::corrupt(
                &env.data.pages_path,
                format!(
                    "block {block} holds {held} records, the layout places {} there",
                    st.block_nodes.len()
                ),
            ));
        }
        q.stats.page_records += held as u32;
        st.others.clear();
        for slot in 0..st.block_nodes.len() {
            let u = st.block_nodes[slot];
            let rec = q.record(env, page, u, slot)?;
            if targets.contains(&u) {
                if !q.colocated.contains_key(&u) {
                    q.stats.used_bytes += geo.record_size as u64;
                    q.stats.used_records += 1;
                    q.expand_record(env, u, rec)?;
                }
                // (Else already expanded from an earlier page.)
            } else {
                let d = q.exact(env, u, rec.vector)?;
                if !q.colocated.contains_key(&u) {
                    st.others.push((d, u, slot as u32));
                }
            }
        }
        // Block pruning: keep the closest ceil(σ · others) (others = the
        // page's records besides its targets).
        let others = held.saturating_sub(targets.len());
        let keep = ((self.sigma as f64 * others as f64).ceil() as usize).min(st.others.len());
        if keep > 0 {
            if keep < st.others.len() {
                st.others.select_nth_unstable_by(keep - 1, |a, b| {
                    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
                });
                st.others.truncate(keep);
            }
            for i in 0..keep {
                let (_, u, slot) = st.others[i];
                q.mark_colocated(env, u);
                st.deferred.push((u, slot));
            }
        }
        Ok(())
    }

    #[inline]
    fn has_deferred(&self, st: &BlockState) -> bool {
        !st.deferred.is_empty()
    }

    fn deferred<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        st: &mut BlockState,
        page: &[u8],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        let mut r = Ok(());
        for &(u, slot) in &st.deferred {
            let rec = match q.record(env, page, u, slot as usize) {
                Ok(rec) => rec,
                Err(e) => {
                    r = Err(e);
                    break;
                }
            };
            q.stats.used_bytes += geo.record_size as u64;
            q.stats.used_records += 1;
            q.stats.colocated += 1;
            r = q.expand(env, u, rec.neighbours);
            if r.is_err() {
                break;
            }
        }
        st.deferred.clear();
        r
    }

    fn state_bytes(st: &BlockState) -> usize {
        st.block_nodes.capacity() * 4 + st.others.capacity() * 12 + st.deferred.capacity() * 8
    }
}

#[cfg(test)]
mod tests;
