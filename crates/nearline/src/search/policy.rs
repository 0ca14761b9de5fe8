//! Page policies: what the executor does with a page when it arrives.
//!
//! The executor reads a block because some candidates (its *targets*) live
//! there, then hands the verified page to a page policy in two steps:
//! [`PagePolicy::on_page`] does what the next reads depend on, then the
//! executor issues those reads (and, for the pipeline, hands them to the
//! kernel), then [`PagePolicy::deferred`] does the rest of the page's work
//! while they are in flight — Starling's I/O–compute pipeline (Algorithm 2),
//! expressed through the one executor loop.
//!
//! * [`TargetRecords`] (DiskANN): only the target records are used (exact
//!   distance, then their neighbours scored and inserted).
//! * [`BlockSearch`] (Starling): every record of the page gets an exact
//!   distance (the result set is de-duplicated when the query ends); the
//!   targets are expanded at once, and the closest ⌈σ·(others)⌉ of the
//!   other records are expanded while the next reads are in flight. A node
//!   expanded this way is marked so it is never read or expanded again.

use super::executor::{Env, Query};
use super::scorer::Scorer;
use crate::data::dtype::Element;
use crate::layout::page::PAGE_HEADER_BYTES;
use crate::layout::Layout;
use crate::{Error, Result};

/// What to do with an arrived page.
pub trait PagePolicy: Send + Sync {
    /// Processes the verified page `page` of block `block`, read for the
    /// nodes `targets` of query `q`: the work the next reads depend on. Work
    /// left in `q` for [`PagePolicy::deferred`] runs after they are issued.
    fn on_page<T: Element, L: Layout, S: Scorer>(
        &self,
        env: &Env<'_, T, L, S>,
        q: &mut Query<T>,
        block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()>;

    /// The page's remaining work, run after the executor issued the reads
    /// `on_page` made possible (nothing by default).
    #[inline]
    fn deferred<T: Element, L: Layout, S: Scorer>(
        &self,
        _env: &Env<'_, T, L, S>,
        _q: &mut Query<T>,
        _page: &[u8],
    ) -> Result<()> {
        Ok(())
    }
}

/// Records in a verified page (its header's count).
#[inline]
fn page_records(page: &[u8]) -> u32 {
    u16::from_le_bytes([page[6], page[7]]) as u32
}

/// DiskANN's page policy: use only the records the page was read for.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetRecords;

impl PagePolicy for TargetRecords {
    #[inline]
    fn on_page<T: Element, L: Layout, S: Scorer>(
        &self,
        env: &Env<'_, T, L, S>,
        q: &mut Query<T>,
        _block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        q.stats.page_records += page_records(page);
        for &v in targets {
            let (_, slot) = env.layout.locate(v);
            let rec = geo.record(page, slot);
            q.stats.used_bytes += geo.record_size as u64;
            q.stats.used_records += 1;
            q.expand_record(env, v, rec)?;
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

impl PagePolicy for BlockSearch {
    fn on_page<T: Element, L: Layout, S: Scorer>(
        &self,
        env: &Env<'_, T, L, S>,
        q: &mut Query<T>,
        block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        let mut nodes = std::mem::take(&mut q.block_nodes);
        nodes.clear();
        env.layout.block_nodes(block, &mut nodes);
        let held = page_records(page);
        if held as usize != nodes.len()
            || PAGE_HEADER_BYTES + nodes.len() * geo.record_size > page.len()
        {
            let n = nodes.len();
            q.block_nodes = nodes;
            return Err(Error::corrupt(
                &env.data.pages_path,
                format!("block {block} holds {held} records, the layout places {n} there"),
            ));
        }
        q.stats.page_records += held;
        q.others.clear();
        let mut result = Ok(());
        for (slot, &u) in nodes.iter().enumerate() {
            let rec = geo.record(page, slot);
            let r = if targets.contains(&u) {
                if q.colocated.contains_key(&u) {
                    // Already expanded from an earlier page.
                    Ok(())
                } else {
                    q.stats.used_bytes += geo.record_size as u64;
                    q.stats.used_records += 1;
                    q.expand_record(env, u, rec)
                }
            } else {
                match q.exact(env, u, rec) {
                    Ok(d) => {
                        if !q.colocated.contains_key(&u) {
                            q.others.push((d, u, slot as u32));
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            };
            if r.is_err() {
                result = r;
                break;
            }
        }
        q.block_nodes = nodes;
        result?;
        // Block pruning: keep the closest ceil(σ · others) (others = the
        // page's records besides its targets).
        let others = (held as usize).saturating_sub(targets.len());
        let keep = ((self.sigma as f64 * others as f64).ceil() as usize).min(q.others.len());
        if keep > 0 {
            if keep < q.others.len() {
                q.others.select_nth_unstable_by(keep - 1, |a, b| {
                    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
                });
                q.others.truncate(keep);
            }
            for i in 0..keep {
                let (_, u, slot) = q.others[i];
                q.mark_colocated(env, u);
                q.deferred.push((u, slot));
            }
        }
        Ok(())
    }

    fn deferred<T: Element, L: Layout, S: Scorer>(
        &self,
        env: &Env<'_, T, L, S>,
        q: &mut Query<T>,
        page: &[u8],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        let mut work = std::mem::take(&mut q.deferred);
        let mut r = Ok(());
        for &(u, slot) in &work {
            let rec = geo.record(page, slot as usize);
            q.stats.used_bytes += geo.record_size as u64;
            q.stats.used_records += 1;
            q.stats.colocated += 1;
            r = q.expand(env, u, rec);
            if r.is_err() {
                break;
            }
        }
        work.clear();
        q.deferred = work;
        r
    }
}
