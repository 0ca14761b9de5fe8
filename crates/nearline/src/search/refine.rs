//! The post-traversal stage: what a query does between the end of its
//! graph traversal and its results.
//!
//! With [`RefinePlan::None`] the results are the exact distances the
//! traversal computed from the records it read. With
//! [`RefinePlan::Rerank`] (two-stage search, Gorgeous §4.3) the traversal
//! may expand nodes from memory without their vectors (an adjacency-only
//! cache); the best `candidates` list entries among those are then read in
//! one batch and ranked exactly, each page processed as it arrives.

use super::plan::RefinePlan;
use super::query::{Env, Io, Phase, Query, REFINE_TAG};
use super::scorer::Scorer;
use crate::cache::Cache;
use crate::elem::Element;
use crate::layout::Layout;
use crate::Result;

/// Starts the stage for a query whose traversal ended: issues the reads of
/// the candidates that need an exact distance and leaves the query
/// `Refining`, or returns false when there is nothing to read.
pub fn begin<T: Element, L: Layout, S: Scorer, C: Cache>(
    env: &Env<'_, T, L, S, C>,
    q: &mut Query<T>,
    io: &mut Io,
    slot: usize,
) -> Result<bool> {
    let RefinePlan::Rerank { candidates } = env.plan.refine else {
        return Ok(false);
    };
    if q.unrefined.is_empty() {
        return Ok(false);
    }
    q.frontier.clear();
    for c in q.cand.items().iter().take(candidates) {
        if q.unrefined.remove(&c.id).is_some() {
            q.frontier.push(c.id);
        }
    }
    // The rest will never be refined: forget them.
    q.unrefined.clear();
    let mut issued = 0;
    for i in 0..q.frontier.len() {
        let v = q.frontier[i];
        if q.issue(env, io, slot, v, 0.0, REFINE_TAG)? {
            issued += 1;
            q.stats.refine_reads += 1;
        }
    }
    if issued == 0 {
        return Ok(false);
    }
    io.engine.flush()?;
    q.refining = issued;
    q.need = refine_need(env, q);
    q.phase = Phase::Refining;
    Ok(true)
}

/// Processes a page the stage read for `targets`: their exact distances.
/// Returns whether the stage is complete.
pub fn on_page<T: Element, L: Layout, S: Scorer, C: Cache>(
    env: &Env<'_, T, L, S, C>,
    q: &mut Query<T>,
    page: &[u8],
    targets: &[u32],
) -> Result<bool> {
    let geo = env.layout.geometry();
    q.stats.page_records += env.layout.block_records(page) as u32;
    for &v in targets {
        let (_, slot) = env.layout.locate_vector(v);
        let vector = env.layout.vector(page, slot).map_err(|m| {
            crate::Error::corrupt(&env.data.pages_path, format!("vector of node {v}: {m}"))
        })?;
        q.stats.used_bytes += if geo.decoupled_vectors() {
            vector.len()
        } else {
            geo.record_size
        } as u64;
        q.stats.used_records += 1;
        q.stats.refined += 1;
        q.exact(env, v, vector)?;
    }
    q.refining = q.refining.saturating_sub(1);
    q.need = refine_need(env, q);
    Ok(q.refining == 0)
}

/// Pages the stage must still process: its own reads, and for a repeatable
/// plan (pages processed in issue order) every read still in flight, late
/// pages of the traversal included.
#[inline]
fn refine_need<T: Element, L: Layout, S: Scorer, C: Cache>(
    env: &Env<'_, T, L, S, C>,
    q: &Query<T>,
) -> usize {
    if env.plan.repeatable {
        q.live
    } else {
        q.refining
    }
}
