//! Page policies: what the executor does with a page when it arrives.
//!
//! The executor reads a block because some candidates (its *targets*) live
//! there, then hands the verified page to the layout's page policy. The ID
//! layout uses [`TargetRecords`]: only the target records are used (exact
//! distance, then their neighbours scored and inserted). Starling's block
//! search (score every record of the page, expand the best σ fraction) is
//! another policy over the same loop: it gets the other nodes of the page
//! from [`Layout::block_nodes`] and uses [`Query::exact`] and
//! [`Query::expand`] on the records it chooses.

use super::executor::{Env, Query};
use super::scorer::Scorer;
use crate::data::dtype::Element;
use crate::layout::Layout;
use crate::Result;

/// What to do with an arrived page.
pub trait PagePolicy: Send + Sync {
    /// Processes the verified page `page` of block `block`, read for the
    /// nodes `targets` of query `q`.
    fn on_page<T: Element, L: Layout, S: Scorer>(
        &self,
        env: &Env<'_, T, L, S>,
        q: &mut Query<T>,
        block: u64,
        page: &[u8],
        targets: &[u32],
    ) -> Result<()>;
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
        for &v in targets {
            let (_, slot) = env.layout.locate(v);
            let rec = geo.record(page, slot);
            q.stats.used_bytes += geo.record_size as u64;
            q.expand_record(env, v, rec)?;
        }
        Ok(())
    }
}
