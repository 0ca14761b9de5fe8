//! DiskANN's synchronous beam: take up to W unexpanded candidates, read
//! their blocks (one read per block), expand cached ones at once, and issue
//! the next hop when the hop's reads are processed. With *adaptive beam*
//! the width is min(2^i, W) at hop i; with *early dispatch* f the next hop
//! goes out once ceil(f·reads) of the current hop's pages are processed and
//! late pages fold in when they arrive (AlayaLaser).

use super::super::plan::BeamPlan;
use super::super::query::{Env, Io, Phase, Query, Read};
use super::super::scorer::Scorer;
use super::{Executor, MAX_READS_PER_QUERY};
use crate::cache::Cache;
use crate::elem::Element;
use crate::layout::Layout;
use crate::Result;

/// The beam executor with its plan.
#[derive(Debug, Clone, Copy)]
pub struct Beam(pub BeamPlan);

/// What the beam keeps per query.
#[derive(Debug, Default)]
pub struct BeamState {
    /// Hops issued so far.
    hop: u32,
    /// Reads the current hop submitted, and how many of them arrived.
    hop_reads: usize,
    hop_done: usize,
    /// Arrivals of the current hop after which the next hop may go out.
    threshold: usize,
}

impl Executor for Beam {
    type State = BeamState;
    const FLUSH_BEFORE_DEFERRED: bool = false;

    #[inline]
    fn start(&self, st: &mut BeamState) {
        *st = BeamState::default();
    }

    fn step<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        st: &mut BeamState,
        io: &mut Io,
        slot: usize,
    ) -> Result<()> {
        let p = self.0;
        loop {
            if st.hop_done < st.threshold {
                q.need = if env.plan.repeatable {
                    // Pages are processed in issue order: the late pages of
                    // earlier hops come first.
                    (q.live + st.threshold).saturating_sub(st.hop_reads)
                } else {
                    st.threshold - st.hop_done
                };
                q.phase = Phase::Waiting;
                return Ok(());
            }
            let mut width = if p.adaptive {
                (1usize << st.hop.min(16)).min(p.width)
            } else {
                p.width
            };
            width = width.min(MAX_READS_PER_QUERY - q.live);
            q.frontier.clear();
            if width > 0 {
                q.cand.take_unexpanded(width, &mut q.frontier);
            }
            if q.frontier.is_empty() {
                if q.live == 0 {
                    q.phase = Phase::Done;
                } else {
                    // Late pages of earlier hops may still bring candidates.
                    q.need = 1;
                    q.phase = Phase::Waiting;
                }
                return Ok(());
            }
            st.hop += 1;
            st.hop_reads = 0;
            st.hop_done = 0;
            // Submit the reads of nodes not in memory (one read per block),
            // then work on those in memory while the reads are in flight.
            q.memory.clear();
            for i in 0..q.frontier.len() {
                let v = q.frontier[i];
                if q.in_memory(env, v, None) {
                    q.memory.push(v);
                    continue;
                }
                if q.issue(env, io, slot, v, 0.0, st.hop)? {
                    st.hop_reads += 1;
                }
            }
            // Hand the hop's reads to the kernel now, before any compute.
            // (One system call that both submits and waits measured ~15%
            // slower than a separate submit and wait: the kernel gets the
            // reads later.)
            if st.hop_reads > 0 {
                io.engine.flush()?;
            }
            // (Decided above: the expansions below may move the filter's
            // bound, but a node not read must be served.)
            for i in 0..q.memory.len() {
                let v = q.memory[i];
                if !q.try_cache(env, v)? {
                    q.serve_loaded(env, v)?;
                }
            }
            st.threshold = match p.early_dispatch {
                Some(f) if st.hop_reads > 0 => {
                    ((f as f64 * st.hop_reads as f64).ceil() as usize).clamp(1, st.hop_reads)
                }
                _ => st.hop_reads,
            };
        }
    }

    #[inline]
    fn arrived<T: Element>(&self, _q: &Query<T>, st: &mut BeamState, read: Read, _r: u16) {
        if read.tag == st.hop {
            st.hop_done += 1;
        }
    }
}
