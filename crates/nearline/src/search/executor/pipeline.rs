//! PipeANN's I/O-driven pipeline: keep up to `width` reads in flight, each
//! for the best candidate neither read nor in flight; process pages one at
//! a time and refill at once. The width starts at the plan's start width
//! and grows by one per arrival (up to W) once the first five list
//! positions have been visited and at most 10% of the recent arrivals were
//! for nodes that had already dropped out of the list. The query ends when
//! every list entry is expanded; reads still in flight for nodes that
//! dropped out are abandoned (the worker reaps them later, before their
//! buffers are reused).
//!
//! "Arrival" is the moment a page is processed: with a repeatable plan,
//! pages are processed in the order the reads were issued, so the width
//! rule and the end of the query see one sequence whatever the timing of
//! the reads. (In that order the page of a node that dropped out comes
//! before those of the better nodes that pushed it out, so a repeatable
//! query seldom abandons a read.)

use super::super::plan::PipelinePlan;
use super::super::query::{Env, Io, Phase, Query, Read};
use super::super::scorer::Scorer;
use super::{Executor, MAX_READS_PER_QUERY};
use crate::cache::Cache;
use crate::elem::Element;
use crate::layout::Layout;
use crate::Result;

/// List positions that must be visited before the pipeline widens.
const PIPELINE_WARM_POSITIONS: usize = 5;
/// Arrivals the pipeline remembers to judge its waste.
const PIPELINE_WINDOW: u32 = 16;

/// The pipelined executor with its plan.
#[derive(Debug, Clone, Copy)]
pub struct Pipeline(pub PipelinePlan);

/// What the pipeline keeps per query.
#[derive(Debug, Default)]
pub struct PipelineState {
    /// Reads the query may have in flight now.
    width: usize,
    /// One bit per recent arrival: set when it served no listed node.
    recent: u32,
    recent_n: u32,
}

impl Executor for Pipeline {
    type State = PipelineState;
    const FLUSH_BEFORE_DEFERRED: bool = true;

    #[inline]
    fn start(&self, st: &mut PipelineState) {
        *st = PipelineState {
            width: self.0.start_width.min(self.0.max_width),
            recent: 0,
            recent_n: 0,
        };
    }

    fn step<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        st: &mut PipelineState,
        io: &mut Io,
        slot: usize,
    ) -> Result<()> {
        let cap = st.width.min(MAX_READS_PER_QUERY);
        let mut exhausted = false;
        while q.live < cap {
            let Some(c) = q.cand.take_best() else {
                exhausted = true;
                break;
            };
            if q.try_memory(env, c.id, Some(c.dist))? {
                continue;
            }
            // The routed distance identifies the list entry when the page arrives.
            q.issue(env, io, slot, c.id, c.dist, 0)?;
        }
        if q.live == 0 && (exhausted || !q.cand.has_unexpanded()) {
            q.phase = Phase::Done;
            return Ok(());
        }
        if (exhausted || !q.cand.has_unexpanded()) && !q.waits_for_listed() {
            // Every list entry is expanded; what is still in flight serves
            // nodes that dropped out of the list: abandon it.
            q.phase = Phase::Done;
            return Ok(());
        }
        q.need = 1;
        q.phase = Phase::Waiting;
        Ok(())
    }

    /// PipeANN's width rule, applied as read `r` arrives.
    #[inline]
    fn arrived<T: Element>(&self, q: &Query<T>, st: &mut PipelineState, _read: Read, r: u16) {
        let listed = q
            .targets
            .iter()
            .any(|t| t.read == r && q.cand.contains(t.dist, t.node));
        let mask = (1u32 << PIPELINE_WINDOW) - 1;
        st.recent = ((st.recent << 1) | u32::from(!listed)) & mask;
        st.recent_n = (st.recent_n + 1).min(PIPELINE_WINDOW);
        if st.width < self.0.max_width
            && q.cand.prefix_taken(PIPELINE_WARM_POSITIONS)
            && st.recent.count_ones() * 10 <= st.recent_n
        {
            st.width += 1;
        }
    }
}
