//! LIRE (SPFresh): the background work that keeps postings small and
//! vectors in their nearest postings while updates arrive.
//!
//! * **Split** a posting over its limit: garbage-collect its stale and
//!   deleted entries first; if it is still over the limit, cut it in two by
//!   balanced 2-means, replace its head by the two halves' vectors nearest
//!   their means (heads are data vectors, as at build), then
//!   **reassign**: a vector of the new postings moves unless its nearest
//!   head holds it (see [`Inner::reassign`]); a vector of the `reassign_k`
//!   postings nearest the old head or either new head (read all at once,
//!   each once) that is nearer a new centroid than both the old head and
//!   its own posting's head (the paper's condition) moves when a new head
//!   is now its nearest.
//! * **Merge** a posting whose live entries fell below the merge threshold:
//!   its live vectors move to their nearest other postings, then it and its
//!   head go away.
//! * With `lire` off (SPANN+), an over-limit posting is only
//!   garbage-collected.
//!
//! A moved vector gets the next version: its new entries are written with
//! it *before* the version map is bumped, and the bump waits out every
//! search that copied the posting map before those entries existed, so a
//! search always finds either the old entries or the new ones. The posting being split or merged is
//! locked for the rewrite; no job holds two posting locks at once.

use super::posting::{entry_bytes, push_entry, read_entry};
use super::store::PostingRef;
use super::{lock, read, write, Inner, DELETED, MAX_VERSION, STRIPES};
use crate::graph::vamana::SearchScratch;
use crate::kernels::l2_f32;
use crate::quant::kmeans::{kmeans, KMeansParams};
use crate::{Error, Result};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A background job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    Split(u32),
    Merge(u32),
    /// Garbage-collect a posting (drop stale and deleted entries) and
    /// rewrite it into one run of blocks.
    Collect(u32),
}

/// The job queue.
#[derive(Debug, Default)]
pub struct Jobs {
    pub queue: VecDeque<Job>,
    pub queued: HashSet<Job>,
    pub stop: bool,
    /// A job is running.
    pub busy: bool,
}

/// A live entry read from a posting.
struct Live {
    id: u32,
    version: u32,
    v: Vec<f32>,
}

impl Inner {
    pub(super) fn enqueue(&self, job: Job) {
        let mut j = lock(&self.jobs);
        if j.stop || !j.queued.insert(job) {
            return;
        }
        j.queue.push_back(job);
        drop(j);
        self.jobs_cv.notify_all();
    }

    /// The background worker: runs jobs until the index closes.
    pub(super) fn worker_loop(&self) {
        loop {
            let job = {
                let mut j = lock(&self.jobs);
                loop {
                    if j.stop {
                        return;
                    }
                    if let Some(job) = j.queue.pop_front() {
                        j.queued.remove(&job);
                        j.busy = true;
                        break job;
                    }
                    j = self.jobs_cv.wait(j).unwrap_or_else(|p| p.into_inner());
                }
            };
            let mut r = self.run_job(job);
            if r.is_ok() && self.store.wants_reclaim() {
                // Blocks released by rewrites become reusable only at a
                // checkpoint: take one before the file grows much more.
                r = self.checkpoint_when(true).map(|_| ());
            }
            {
                let mut j = lock(&self.jobs);
                j.busy = false;
            }
            self.jobs_cv.notify_all();
            if let Err(e) = r {
                *lock(&self.failed) = Some(e.to_string());
                let mut j = lock(&self.jobs);
                j.stop = true;
                return;
            }
        }
    }

    /// Runs every queued job in the calling thread, after waiting for the
    /// worker's current one.
    pub(super) fn run_all_jobs(&self) -> Result<()> {
        loop {
            let job = {
                let mut j = lock(&self.jobs);
                while j.busy {
                    j = self.jobs_cv.wait(j).unwrap_or_else(|p| p.into_inner());
                }
                match j.queue.pop_front() {
                    Some(job) => {
                        j.queued.remove(&job);
                        job
                    }
                    None => return Ok(()),
                }
            };
            self.run_job(job)?;
        }
    }

    fn run_job(&self, job: Job) -> Result<()> {
        if self.closing.load(Ordering::Relaxed) {
            return Ok(());
        }
        let _m = lock(&self.maint);
        match job {
            Job::Split(p) => self.split(p)?,
            Job::Merge(p) => self.merge(p)?,
            Job::Collect(p) => self.collect(p)?,
        }
        // Splits and merges leave the old heads as tombstones: once they
        // are a thirty-second of the live heads, rewire around them and
        // free their slots for the next splits (memory stays with the live
        // heads). Only jobs retire heads, and jobs run one at a time under
        // `maint`, so no retirement is half done here.
        let due = {
            let h = read(&self.heads);
            h.tombstones() > (h.live() / 32).max(64)
        };
        if due {
            let freed = write(&self.heads).consolidate();
            // An insert may have routed to a retired head just before: its
            // slot is reused only once every placement under way finished,
            // so no vector lands in a posting that a reuse put elsewhere.
            drop(write(&self.placing));
            write(&self.heads).reuse(&freed);
        }
        Ok(())
    }

    /// Waits until every search that took its copy of the posting map
    /// before now has finished. Called between writing a moved vector's new
    /// entries and bumping its version: a search holding an older copy (with
    /// none of the new entries) must not see the bump, or it would find
    /// neither the old entries (stale) nor the new ones (not in its copy).
    /// Searches hold the gate from their copy of the map to their last
    /// version check.
    fn wait_out_searches(&self) {
        drop(write(&self.gate));
    }

    /// Live entries of a posting's stream, one per id.
    fn live_entries(&self, stream: &[u8], count: usize) -> Vec<Live> {
        let dim = self.dim;
        let versions = read(&self.versions);
        let mut seen = HashSet::with_capacity(count);
        let mut out = Vec::new();
        for i in 0..count {
            let mut v = vec![0f32; dim];
            let h = read_entry(stream, dim, i, &mut v);
            let ok = versions
                .get(h.id as usize)
                .map(|c| c.load(Ordering::Acquire))
                .is_some_and(|c| c & DELETED == 0 && c == h.version);
            if ok && seen.insert(h.id) {
                out.push(Live {
                    id: h.id,
                    version: h.version,
                    v,
                });
            }
        }
        out
    }

    /// Writes `entries` as posting `p`'s new contents (fresh blocks), or as
    /// a new posting; returns its reference.
    fn write_posting(&self, p: u32, entries: &[&Live]) -> Result<PostingRef> {
        let dim = self.dim;
        let mut s = Vec::with_capacity(entries.len() * entry_bytes(dim));
        for e in entries {
            push_entry(&mut s, e.id, e.version, &e.v);
        }
        let nb = super::posting::blocks_for(entries.len(), dim).max(1);
        let blocks = self.store.allocate(nb)?;
        if let Err(err) = self.store.write(p, 0, &blocks, &s) {
            self.store.give_back(&blocks);
            return Err(err);
        }
        Ok(PostingRef {
            blocks,
            count: entries.len() as u32,
        })
    }

    fn collect(&self, p: u32) -> Result<()> {
        let _stripe = lock(&self.stripes[p as usize % STRIPES]);
        let cur = match read(&self.postings).get(p as usize).cloned().flatten() {
            Some(c) => c,
            None => return Ok(()),
        };
        let stream = self.store.read(p, &cur)?;
        let live = self.live_entries(&stream, cur.count as usize);
        if live.is_empty() && self.params.lire {
            // Nothing left: a merge retires it.
            drop(_stripe);
            return self.merge(p);
        }
        let refs: Vec<&Live> = live.iter().collect();
        let r = self.write_posting(p, &refs)?;
        write(&self.postings)[p as usize] = Some(Arc::new(r));
        self.store.release(&cur.blocks);
        self.counters.collected.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn split(&self, p: u32) -> Result<()> {
        let stripe = lock(&self.stripes[p as usize % STRIPES]);
        let cur = match read(&self.postings).get(p as usize).cloned().flatten() {
            Some(c) => c,
            None => return Ok(()),
        };
        if (cur.count as usize) <= self.params.posting_limit {
            return Ok(());
        }
        let stream = self.store.read(p, &cur)?;
        let live = self.live_entries(&stream, cur.count as usize);
        if live.len() <= self.params.posting_limit || !self.params.lire {
            // Garbage collection only.
            let refs: Vec<&Live> = live.iter().collect();
            let r = self.write_posting(p, &refs)?;
            write(&self.postings)[p as usize] = Some(Arc::new(r));
            self.store.release(&cur.blocks);
            self.counters.collected.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // Which entries are another live head's vector (a head's vector
        // replicated here): a new head must not be one (two heads at one
        // point split its queries between them by ties), so 2-means runs on
        // the others, and these join the nearer half.
        let dim = self.dim;
        let headlike: Vec<bool> = {
            let heads = read(&self.heads);
            let mut sc = SearchScratch::new();
            live.iter()
                .map(|e| {
                    heads
                        .search(&mut sc, &e.v, 2, super::build::REPLICA_L)
                        .iter()
                        .any(|&(_, h)| h != p && heads.vector(h) == &e.v[..])
                })
                .collect()
        };
        let basis: Vec<&Live> = if headlike.iter().filter(|&&h| !h).count() >= 2 {
            live.iter()
                .zip(&headlike)
                .filter(|(_, &h)| !h)
                .map(|(e, _)| e)
                .collect()
        } else {
            live.iter().collect()
        };
        // Balanced 2-means.
        let rows: Vec<f32> = basis.iter().flat_map(|e| e.v.iter().copied()).collect();
        let km = kmeans(
            &rows,
            dim,
            &KMeansParams {
                k: 2,
                max_iters: 10,
                seed: self.params.seed ^ p as u64,
            },
        )?;
        let (c0, c1) = km.centroids.split_at(dim);
        let mut g: [Vec<&Live>; 2] = [Vec::new(), Vec::new()];
        for (e, &a) in basis.iter().zip(&km.assignment) {
            g[a as usize].push(e);
        }
        if basis.len() < live.len() {
            for (e, _) in live.iter().zip(&headlike).filter(|(_, &h)| h) {
                let side = usize::from(l2_f32(&e.v, c1) < l2_f32(&e.v, c0));
                g[side].push(e);
            }
        }
        if g[0].is_empty() || g[1].is_empty() {
            // Inseparable (duplicates): halves.
            let all: Vec<&Live> = live.iter().collect();
            let mid = all.len() / 2;
            g = [all[..mid].to_vec(), all[mid..].to_vec()];
        }
        // The new heads are data vectors, as the build's: each half's
        // member nearest its mean that is not a head already.
        let is_head: HashSet<u32> = live
            .iter()
            .zip(&headlike)
            .filter(|(_, &h)| h)
            .map(|(e, _)| e.id)
            .collect();
        let cents = [
            nearest_live(&g[0], &mean(&g[0], dim, c0), &is_head),
            nearest_live(&g[1], &mean(&g[1], dim, c1), &is_head),
        ];
        let old_head = read(&self.heads).vector(p).to_vec();
        // The new heads' postings exist before the heads are reachable: a
        // route to a head always finds its posting (or a retired one).
        let (a, b) = {
            let mut heads = write(&self.heads);
            (heads.reserve(), heads.reserve())
        };
        let ra = self.write_posting(a, &g[0])?;
        let rb = self.write_posting(b, &g[1])?;
        {
            let mut map = write(&self.postings);
            let need = (a.max(b) as usize) + 1;
            if map.len() < need {
                map.resize(need, None);
            }
            map[a as usize] = Some(Arc::new(ra));
            map[b as usize] = Some(Arc::new(rb));
        }
        {
            let mut heads = write(&self.heads);
            let mut sc = SearchScratch::new();
            heads.link(a, &cents[0], &mut sc);
            heads.link(b, &cents[1], &mut sc);
            heads.retire_into(p, &[a, b]);
        }
        write(&self.postings)[p as usize] = None;
        self.store.release(&cur.blocks);
        drop(stripe);
        self.counters.splits.fetch_add(1, Ordering::Relaxed);
        // A placement that routed before the new heads were linked may
        // still be appending to a neighbour posting a vector whose nearest
        // head is now a new one: wait until every placement under way has
        // appended, so the neighbour postings read below hold its entry
        // (and the reassignment moves it).
        drop(write(&self.placing));
        // Reassignment. Every vector of the split posting is checked (not
        // only those the paper's condition names): its nearest head must
        // hold it afterwards, or a query routed to that head alone misses
        // it (see [`Inner::reassign`]).
        let cand: Vec<(u32, &Live)> = [(a, &g[0]), (b, &g[1])]
            .into_iter()
            .flat_map(|(slot, grp)| grp.iter().map(move |e| (slot, *e)))
            .collect();
        // The postings around the old head and around each new one: a new
        // head is a member of the split posting, and an elongated posting
        // puts it far from the old head, beside postings the old head's
        // neighbourhood does not reach (measured: a new head whose 2nd and
        // 5th nearest postings held a vector it was now nearest to, those
        // postings 80th and 90th from the old head of 114).
        let near: Vec<u32> = {
            let heads = read(&self.heads);
            let mut sc = SearchScratch::new();
            let mut seen = HashSet::new();
            let mut near = Vec::new();
            for centre in [&old_head[..], &cents[0], &cents[1]] {
                near.extend(
                    heads
                        .search(
                            &mut sc,
                            centre,
                            self.params.reassign_k + 2,
                            (self.params.reassign_k + 2).max(64),
                        )
                        .into_iter()
                        .map(|x| x.1)
                        .filter(|&q| q != a && q != b)
                        .take(self.params.reassign_k)
                        .filter(|&q| seen.insert(q)),
                );
            }
            near
        };
        let mut nbr: Vec<Live> = Vec::new();
        let around: Vec<(u32, Arc<PostingRef>, Vec<f32>)> = {
            let map = read(&self.postings);
            let heads = read(&self.heads);
            near.iter()
                .filter_map(|&q| {
                    map.get(q as usize)
                        .cloned()
                        .flatten()
                        .map(|r| (q, r, heads.vector(q).to_vec()))
                })
                .collect()
        };
        let items: Vec<(u32, &PostingRef)> = around.iter().map(|(q, r, _)| (*q, &**r)).collect();
        let streams = self.store.read_many(&items)?;
        // Which of the neighbour postings hold which ids: a split vector
        // whose nearest head is one of them stays if that posting holds it.
        let mut held: HashSet<(u32, u32)> = HashSet::new();
        for ((q, r, head_q), s) in around.iter().zip(&streams) {
            for e in self.live_entries(s, r.count as usize) {
                held.insert((*q, e.id));
                // The paper's condition (a new centroid nearer than the old
                // head), and one it implies is worth checking: a new
                // centroid nearer than the vector's own posting's head.
                // Otherwise the posting it is in stays at least as good a
                // choice as before the split, and no head search is spent.
                let d_new = l2_f32(&e.v, &cents[0]).min(l2_f32(&e.v, &cents[1]));
                if d_new <= l2_f32(&e.v, &old_head) && d_new < l2_f32(&e.v, head_q) {
                    nbr.push(e);
                }
            }
        }
        let read: HashSet<u32> = around.iter().map(|(q, _, _)| *q).collect();
        let mut moving = self.reassign(&cand, &old_head, [a, b], &read, &held);
        let have: HashSet<u32> = g.iter().flatten().map(|e| e.id).collect();
        moving.extend(self.nearest_now_new(a, b, &have, &nbr));
        self.move_all(&moving)
    }

    /// Neighbour vectors whose nearest head is now one of a split's new
    /// heads (and that are not in it already): LIRE moves them, so the
    /// nearest posting holds them.
    fn nearest_now_new<'a>(
        &self,
        a: u32,
        b: u32,
        have: &HashSet<u32>,
        nbr: &'a [Live],
    ) -> Vec<&'a Live> {
        let heads = read(&self.heads);
        let mut sc = SearchScratch::new();
        let mut seen = HashSet::new();
        nbr.iter()
            .filter(|e| !have.contains(&e.id) && seen.insert(e.id))
            .filter(|e| {
                heads
                    .search(&mut sc, &e.v, 1, super::build::REPLICA_L)
                    .first()
                    .is_some_and(|&(_, h)| h == a || h == b)
            })
            .collect()
    }

    /// The vectors of a split posting (each with the new posting `slot` that
    /// holds it) to re-place, so that every live vector stays in the
    /// posting of its nearest head (SPFresh's nearest-partition
    /// assignment: a query that probes that head alone finds it). A vector
    /// stays when the head search finds, as its nearest head, the new
    /// posting that holds it or a neighbour posting that holds it too
    /// (`read_around`: the postings read around the split, `held`: their
    /// (posting, id) pairs); for a nearest head outside those, when it is
    /// at least as near as the split one (the split posting then held a
    /// further replica, and the nearest one holds it as before). Otherwise
    /// it moves. (Keeping a vector wherever its posting was among its
    /// `replicas` nearest heads, as this did before, left vectors that only
    /// an `nprobe` of `replicas` or more found; and the distance rule alone
    /// trusts an earlier head search that a change of the head graph may
    /// now answer differently.)
    fn reassign<'a>(
        &self,
        cand: &[(u32, &'a Live)],
        old_head: &[f32],
        split: [u32; 2],
        read_around: &HashSet<u32>,
        held: &HashSet<(u32, u32)>,
    ) -> Vec<&'a Live> {
        let mut out = Vec::new();
        let heads = read(&self.heads);
        let mut sc = SearchScratch::new();
        for &(slot, e) in cand {
            let near = heads.search(&mut sc, &e.v, 1, super::build::REPLICA_L);
            let stays = near.first().is_some_and(|&(_, n)| {
                n == slot
                    || held.contains(&(n, e.id))
                    || (!split.contains(&n)
                        && !read_around.contains(&n)
                        && l2_f32(&e.v, heads.vector(n)) <= l2_f32(&e.v, old_head))
            });
            if !stays {
                out.push(e);
            }
        }
        out
    }

    /// Moves vectors: new entries at the next version in their RNG
    /// choices, then (once the searches that copied the map before those
    /// entries existed are over) the version bump that makes their old
    /// entries stale.
    fn move_all(&self, es: &[&Live]) -> Result<()> {
        let mut seen = HashSet::new();
        // A vector at the last version a slot takes stays where it is.
        let es: Vec<&Live> = es
            .iter()
            .copied()
            .filter(|e| e.version < MAX_VERSION && seen.insert(e.id))
            .collect();
        if es.is_empty() {
            return Ok(());
        }
        let moves: Vec<(u32, u32, usize)> = es
            .iter()
            .enumerate()
            .map(|(j, e)| (e.id, e.version + 1, j))
            .collect();
        let rows: Vec<f32> = es.iter().flat_map(|e| e.v.iter().copied()).collect();
        self.place(&moves, &rows, None)?;
        self.wait_out_searches();
        let versions = read(&self.versions);
        for (m, e) in moves.iter().zip(&es) {
            // Only a vector still at the version we moved (not deleted or
            // moved since) takes the new one.
            let _ = versions[m.0 as usize].compare_exchange(
                e.version,
                m.1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        self.counters
            .reassigned
            .fetch_add(moves.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn merge(&self, p: u32) -> Result<()> {
        // Move the live entries out (p still serves searches meanwhile),
        // then retire p once no entry arrived since.
        let mut done_count = 0usize;
        loop {
            let cur = match read(&self.postings).get(p as usize).cloned().flatten() {
                Some(c) => c,
                None => return Ok(()),
            };
            if read(&self.heads).live() <= 1 {
                return Ok(());
            }
            let stream = self.store.read(p, &cur)?;
            let live = self.live_entries(&stream, cur.count as usize);
            if done_count == 0 && live.len() >= self.params.merge_threshold {
                return Ok(());
            }
            if live.iter().any(|e| e.version >= MAX_VERSION) {
                // A vector at the last version a slot takes cannot move:
                // the posting stays.
                return Ok(());
            }
            // After the first pass the entries moved out are stale here:
            // what is still live arrived meanwhile.
            let fresh: Vec<&Live> = live.iter().collect();
            let mut moves = Vec::new();
            let mut rows = Vec::new();
            let mut olds = Vec::new();
            for e in &fresh {
                moves.push((e.id, e.version + 1, moves.len()));
                rows.extend_from_slice(&e.v);
                olds.push(e.version);
            }
            if !moves.is_empty() {
                self.place(&moves, &rows, Some(p))?;
                self.wait_out_searches();
                let versions = read(&self.versions);
                for (m, &old) in moves.iter().zip(&olds) {
                    let _ = versions[m.0 as usize].compare_exchange(
                        old,
                        m.1,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
            }
            done_count += 1;
            let stripe = lock(&self.stripes[p as usize % STRIPES]);
            let now = read(&self.postings).get(p as usize).cloned().flatten();
            match now {
                Some(r) if r.count == cur.count => {
                    // Unreachable first, then gone: a route to a live head
                    // always finds its posting.
                    write(&self.heads).remove(p);
                    write(&self.postings)[p as usize] = None;
                    self.store.release(&r.blocks);
                    drop(stripe);
                    self.counters.merges.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Some(_) => {
                    // Inserts landed meanwhile: move them too.
                    drop(stripe);
                    if done_count > 16 {
                        return Err(Error::arg(format!(
                            "posting {p} kept receiving inserts while being merged"
                        )));
                    }
                }
                None => return Ok(()),
            }
        }
    }
}

/// The vector of `g` nearest `centre` whose id `is_head` does not hold;
/// the nearest one when every member is a head's vector (the halves of
/// duplicates); `centre` for an empty group.
fn nearest_live(g: &[&Live], centre: &[f32], is_head: &HashSet<u32>) -> Vec<f32> {
    let mut by: Vec<(f32, &Live)> = g.iter().map(|e| (l2_f32(&e.v, centre), *e)).collect();
    by.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.id.cmp(&b.1.id)));
    by.iter()
        .find(|(_, e)| !is_head.contains(&e.id))
        .or(by.first())
        .map_or_else(|| centre.to_vec(), |(_, e)| e.v.clone())
}

/// The mean of a group's vectors (`fallback` for an empty group).
fn mean(g: &[&Live], dim: usize, fallback: &[f32]) -> Vec<f32> {
    if g.is_empty() {
        return fallback.to_vec();
    }
    let mut acc = vec![0f64; dim];
    for e in g {
        for (a, &x) in acc.iter_mut().zip(&e.v) {
            *a += x as f64;
        }
    }
    acc.iter().map(|&a| (a / g.len() as f64) as f32).collect()
}
