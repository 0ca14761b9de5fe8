//! The memory budget while an index is open: one ledger of what it holds
//! (its fixed structures, its cache, its idle search workers, the scratch
//! of the searches running) against the budget.
//!
//! A search batch is admitted with the scratch its plan counted. It takes
//! what the budget has free; when that is short, idle workers give way
//! first, then the cache gives up entries (the least valuable first, by its
//! own policy) for as long as the search runs, and takes them back when it
//! ends. A search whose scratch an empty cache could hold is never refused:
//! when the scratch of other searches running is what stands in the way,
//! it waits for them. (The planner refuses, before any of this, a search
//! that even an empty cache could not hold.) Resizes run one at a time,
//! and the room a search is promised is counted before the cache gives it
//! up, so the ledger's total — and what the index holds — never exceeds
//! the budget, however many searches run at once.

use crate::{Error, Result};
use serde::Serialize;
use std::sync::{Condvar, Mutex, MutexGuard};

/// What the ledger moves: the index's idle workers and its cache.
pub trait Holdings {
    /// Bytes idle workers hold.
    fn idle_bytes(&self) -> u64;
    /// Drops idle workers until they hold at most `bytes`.
    fn trim_idle(&self, bytes: u64);
    /// The cache gives up entries until it holds at most `max_bytes`
    /// (once no search reads it); returns the bytes it holds.
    fn evict_cache(&self, max_bytes: u64) -> Result<u64>;
    /// The cache takes back entries while it holds at most `max_bytes`;
    /// returns the bytes it holds.
    fn regrow_cache(&self, max_bytes: u64) -> Result<u64>;
    /// The cache drops what it holds and loads anew, over the index as it
    /// is now, at most `max_bytes` (a BFS cache of a graph updated in
    /// place); returns the bytes it holds. A cache with nothing to reload
    /// keeps what it holds.
    fn reload_cache(&self, _max_bytes: u64) -> Result<u64> {
        self.evict_cache(u64::MAX)
    }
    /// What a reload of `max_bytes` holds besides the entries it loads.
    fn reload_scratch(&self, _max_bytes: u64) -> u64 {
        0
    }
}

/// The idle workers a batch would take, and taking them.
pub trait Claim {
    /// Bytes of the idle workers the batch would take now.
    fn available(&self) -> u64;
    /// Takes them from the idle pool; returns their bytes.
    fn take(&mut self) -> u64;
}

/// The ledger's state, as `info()["memory"]` shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LedgerView {
    pub budget: u64,
    /// Whether the budget binds (false: nearline sized it, and searches
    /// may take more scratch than it reserves).
    pub binding: bool,
    /// Everything but the cache and the workers.
    pub fixed: u64,
    /// What the cache holds now, and held at open.
    pub cache: u64,
    pub cache_planned: u64,
    /// Scratch of the searches running.
    pub running: u64,
    /// Searches that took memory from the cache, and the most it lent.
    pub borrows: u64,
    pub borrowed_peak: u64,
    /// The highest total the ledger has counted (fixed + cache + workers).
    pub peak: u64,
    /// Why the cache last failed to take entries back (`None`: never).
    pub regrow_error: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    view: LedgerView,
    /// What a regrowth holds besides the entries it loads.
    resize_scratch: u64,
    /// Scratch promised to a search waiting for the cache to yield it.
    pending: u64,
    /// Bytes a regrowth under way may add to the cache.
    growing: u64,
    /// A resize of the cache is under way (one at a time).
    busy: bool,
    /// Bytes the cache's plan gave the update layer ([`Ledger::grow_fixed`]).
    to_updates: u64,
    /// Scratch the plan reserved for the workers ([`Ledger::keeping`]).
    keep: u64,
}

impl State {
    /// Everything counted, with `idle` bytes of idle workers.
    fn used(&self, idle: u64) -> u64 {
        let v = &self.view;
        v.fixed
            .saturating_add(v.cache)
            .saturating_add(self.growing)
            .saturating_add(idle)
            .saturating_add(v.running)
            .saturating_add(self.pending)
    }

    fn note_peak(&mut self, idle: u64) {
        let held = self
            .view
            .fixed
            .saturating_add(self.view.cache)
            .saturating_add(self.growing)
            .saturating_add(idle)
            .saturating_add(self.view.running);
        self.view.peak = self.view.peak.max(held);
    }
}

/// The ledger of one open index.
#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<State>,
    changed: Condvar,
}

impl Ledger {
    /// A ledger for `budget` bytes (binding unless nearline sized it) over
    /// `fixed` bytes of structures and a cache of `cache` bytes, which holds
    /// up to `resize_scratch` bytes more while it takes entries back.
    pub fn new(budget: u64, binding: bool, fixed: u64, cache: u64, resize_scratch: u64) -> Self {
        let mut st = State {
            resize_scratch,
            view: LedgerView {
                budget,
                binding,
                fixed,
                cache,
                cache_planned: cache,
                ..LedgerView::default()
            },
            ..State::default()
        };
        st.note_peak(0);
        Ledger {
            state: Mutex::new(st),
            changed: Condvar::new(),
        }
    }

    /// The ledger, keeping `bytes` of the budget for the workers' scratch
    /// when the update layer grows (see [`Ledger::grow_fixed`]).
    pub fn keeping(self, bytes: u64) -> Self {
        if let Ok(mut st) = self.state.lock() {
            st.keep = bytes;
        }
        self
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| Error::Engine("memory ledger lock poisoned".into()))
    }

    /// The ledger now.
    pub fn view(&self) -> LedgerView {
        self.lock().map(|s| s.view.clone()).unwrap_or_default()
    }

    /// The ledger now with what `idle` reads of the idle workers at the
    /// same moment (workers move between the idle pool and a batch only
    /// under the ledger's lock, so neither is counted twice).
    pub fn snapshot(&self, idle: &dyn Fn() -> u64) -> (LedgerView, u64) {
        match self.lock() {
            Ok(s) => (s.view.clone(), idle()),
            Err(_) => (LedgerView::default(), idle()),
        }
    }

    /// Admits a search batch whose workers need `need` bytes. The idle
    /// workers it would take (`claim`) count within its need, and it takes
    /// them when it is admitted, in the same critical section: a batch that
    /// waits holds nothing, so every wait ends when a search, a resize or a
    /// regrowth under way ends. Returns the bytes the cache gave up for it.
    /// Refuses only what an empty cache could not hold.
    pub fn admit(&self, need: u64, h: &dyn Holdings, claim: &mut dyn Claim) -> Result<u64> {
        let mut st = self.lock()?;
        let mut borrowed = 0u64;
        loop {
            let idle = h.idle_bytes();
            let mine = claim.available().min(idle);
            let used = st.used(idle);
            let free = st.view.budget.saturating_sub(used).saturating_add(mine);
            if !st.view.binding || need <= free {
                claim.take();
                st.view.running = st.view.running.saturating_add(need);
                let idle = h.idle_bytes();
                st.note_peak(idle);
                if borrowed > 0 {
                    st.view.borrows += 1;
                }
                return Ok(borrowed);
            }
            let short = need - free;
            if idle > mine {
                // Idle workers it would not take give way first: they only
                // save a later search opening its own.
                h.trim_idle(idle.saturating_sub(short));
                if h.idle_bytes() < idle {
                    continue;
                }
            }
            let alone = st.view.budget.saturating_sub(st.view.fixed);
            if need > alone {
                return Err(Error::arg(format!(
                    "this search needs about {need} bytes of worker scratch, but memory_budget={} \
                     leaves the workers at most {alone} bytes even with the cache empty; open \
                     the index with a memory_budget of at least {}",
                    st.view.budget,
                    st.view.fixed.saturating_add(need)
                )));
            }
            // What the budget would have free with the cache emptied.
            let without_cache = st
                .view
                .budget
                .saturating_sub(used - st.view.cache)
                .saturating_add(mine);
            if !st.busy && need <= without_cache {
                // The cache yields what is short while the search runs; the
                // room is promised (pending) before it yields.
                let target = st.view.cache.saturating_sub(short);
                let promised = need - mine;
                st.busy = true;
                st.pending += promised;
                drop(st);
                let r = h.evict_cache(target);
                st = self.lock()?;
                st.busy = false;
                st.pending -= promised;
                self.changed.notify_all();
                let held = r?;
                borrowed += st.view.cache.saturating_sub(held);
                st.view.cache = held;
                let lent = st.view.cache_planned.saturating_sub(held);
                st.view.borrowed_peak = st.view.borrowed_peak.max(lent);
                continue;
            }
            // The scratch of searches running, or a resize under way,
            // stands in the way: wait for them.
            st = self
                .changed
                .wait(st)
                .map_err(|_| Error::Engine("memory ledger lock poisoned".into()))?;
        }
    }

    /// Takes `bytes` more into the fixed structures for as long as the
    /// index holds them (an update layer's growth): the cache yields what
    /// the budget is short, as it does for a search. Refused when even an
    /// empty cache leaves too little (the caller merges first).
    ///
    /// The room comes from what the budget leaves beyond the cache's plan
    /// and the workers' reserved scratch first, then out of the cache's
    /// plan (`cache_planned` shrinks by it), never out of the workers'
    /// room: else each search would borrow its scratch back from the cache,
    /// which regrows after it, reading from disk (measured: in-place
    /// updates on wordnet at 20% of the raw bytes).
    pub fn grow_fixed(&self, bytes: u64, h: &dyn Holdings) -> Result<()> {
        struct NoWorkers;
        impl Claim for NoWorkers {
            fn available(&self) -> u64 {
                0
            }
            fn take(&mut self) -> u64 {
                0
            }
        }
        let from_cache = {
            let mut st = self.lock()?;
            let v = &st.view;
            let spare = v
                .budget
                .saturating_sub(v.fixed)
                .saturating_sub(v.cache_planned)
                .saturating_sub(st.keep);
            let take = bytes.saturating_sub(spare).min(v.cache_planned);
            st.view.cache_planned -= take;
            st.to_updates += take;
            take
        };
        if let Err(e) = self.admit(bytes, h, &mut NoWorkers) {
            let mut st = self.lock()?;
            st.view.cache_planned += from_cache;
            st.to_updates -= from_cache;
            return Err(e);
        }
        let mut st = self.lock()?;
        st.view.running = st.view.running.saturating_sub(bytes);
        st.view.fixed = st.view.fixed.saturating_add(bytes);
        // The cache comes down to its plan now, not at the next search.
        if st.view.binding && !st.busy && st.view.cache > st.view.cache_planned {
            let target = st.view.cache_planned;
            st.busy = true;
            drop(st);
            let r = h.evict_cache(target);
            let mut st = self.lock()?;
            st.busy = false;
            self.changed.notify_all();
            st.view.cache = r?;
        }
        Ok(())
    }

    /// Reloads the cache over the index as it is now (an index updated in
    /// place: a BFS cache loaded at open holds, after enough churn, records
    /// that are no longer near the start). It waits for a resize under
    /// way, and reloads at most what the cache holds now: the old entries
    /// go before the load, and what the load holds besides its entries is
    /// counted while it runs, out of the cache's own size where the budget
    /// has no room beside it. A failure is recorded as a regrowth's is
    /// (`regrow_error`); the cache is then empty, and a later search's end
    /// regrows it.
    pub fn reload_cache(&self, h: &dyn Holdings) {
        let Ok(mut st) = self.lock() else {
            return;
        };
        while st.busy {
            st = match self.changed.wait(st) {
                Ok(s) => s,
                Err(_) => return,
            };
        }
        let held = st.view.cache;
        if held == 0 {
            return;
        }
        let scratch = h.reload_scratch(held);
        let room = if st.view.binding {
            st.view.budget.saturating_sub(st.used(h.idle_bytes()))
        } else {
            u64::MAX
        };
        let target = held.min(held.saturating_add(room).saturating_sub(scratch));
        if target == 0 {
            return;
        }
        st.busy = true;
        st.view.cache = 0;
        st.growing = target + scratch;
        st.note_peak(h.idle_bytes());
        drop(st);
        self.end_growth(h, h.reload_cache(target));
    }

    /// Ends a regrowth or reload under way whose cache now holds `r`
    /// bytes (or failed with it: the error is recorded).
    fn end_growth(&self, h: &dyn Holdings, r: Result<u64>) {
        let Ok(mut st) = self.lock() else {
            return;
        };
        st.busy = false;
        st.growing = 0;
        match r {
            Ok(held) => st.view.cache = held,
            Err(e) => st.view.regrow_error = Some(e.to_string()),
        }
        st.note_peak(h.idle_bytes());
        self.changed.notify_all();
    }

    /// Gives back `bytes` of what [`Ledger::grow_fixed`] took: the cache's
    /// plan gets back what it gave, and the cache takes the room back while
    /// the budget has it.
    pub fn shrink_fixed(&self, bytes: u64, h: &dyn Holdings) {
        let moved = match self.lock() {
            Ok(mut st) => {
                let b = bytes.min(st.view.fixed);
                st.view.fixed -= b;
                st.view.running = st.view.running.saturating_add(b);
                let back = b.min(st.to_updates);
                st.to_updates -= back;
                st.view.cache_planned += back;
                b
            }
            Err(_) => return,
        };
        self.release(moved, h, &mut || {});
    }

    /// Ends a batch admitted with `need` bytes: `put_back` (called under
    /// the ledger's lock) hands its workers back to the idle pool; idle
    /// workers keep only what the budget leaves them beside a full cache,
    /// and a cache that lent memory takes it back while the budget has room.
    pub fn release(&self, need: u64, h: &dyn Holdings, put_back: &mut dyn FnMut()) {
        let Ok(mut st) = self.lock() else {
            put_back();
            return;
        };
        put_back();
        st.view.running = st.view.running.saturating_sub(need);
        let lent = st.view.cache < st.view.cache_planned;
        if st.view.binding {
            // Idle workers keep what the budget leaves them beside a full
            // cache (and, while it is short, the scratch of its regrowth).
            let v = &st.view;
            let beside_full = v
                .fixed
                .saturating_add(v.cache_planned.max(v.cache))
                .saturating_add(st.growing)
                .saturating_add(v.running)
                .saturating_add(st.pending)
                .saturating_add(if lent { st.resize_scratch } else { 0 });
            h.trim_idle(v.budget.saturating_sub(beside_full));
        }
        st.note_peak(h.idle_bytes());
        self.changed.notify_all();
        if !st.view.binding || st.busy || !lent {
            return;
        }
        let room = st.view.budget.saturating_sub(st.used(h.idle_bytes()));
        if room <= st.resize_scratch {
            return;
        }
        let target = st
            .view
            .cache_planned
            .min(st.view.cache + room - st.resize_scratch);
        st.busy = true;
        st.growing = target - st.view.cache + st.resize_scratch;
        drop(st);
        // What the workers freed goes back to the kernel before the cache
        // takes the room again.
        crate::util::return_freed_memory();
        self.end_growth(h, h.regrow_cache(target));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A cache of up to `full` bytes in 100-byte entries, an idle pool of
    /// `idle` bytes and the batches' `workers`; `over` records the most
    /// cache + idle + workers ever passed `room` by.
    struct Fake {
        cache: AtomicU64,
        full: u64,
        idle: AtomicU64,
        workers: AtomicU64,
        room: u64,
        over: AtomicU64,
    }

    impl Fake {
        fn new(cache: u64, room: u64) -> Self {
            Fake {
                cache: AtomicU64::new(cache),
                full: cache,
                idle: AtomicU64::new(0),
                workers: AtomicU64::new(0),
                room,
                over: AtomicU64::new(0),
            }
        }

        fn check(&self) {
            let total = self.cache.load(Ordering::SeqCst)
                + self.idle.load(Ordering::SeqCst)
                + self.workers.load(Ordering::SeqCst);
            if total > self.room {
                self.over.fetch_max(total - self.room, Ordering::SeqCst);
            }
        }
    }

    impl Holdings for Fake {
        fn idle_bytes(&self) -> u64 {
            self.idle.load(Ordering::SeqCst)
        }
        fn trim_idle(&self, bytes: u64) {
            self.idle.fetch_min(bytes, Ordering::SeqCst);
        }
        fn evict_cache(&self, max: u64) -> Result<u64> {
            let held = self.cache.load(Ordering::SeqCst).min(max / 100 * 100);
            self.cache.store(held, Ordering::SeqCst);
            Ok(held)
        }
        fn regrow_cache(&self, max: u64) -> Result<u64> {
            let held = self.full.min(max / 100 * 100);
            self.cache.store(held, Ordering::SeqCst);
            self.check();
            Ok(held)
        }
        /// Drops every entry, then loads with `RELOAD_SCRATCH` bytes held
        /// beside the entries while it runs (counted in `workers` then).
        fn reload_cache(&self, max: u64) -> Result<u64> {
            self.cache.store(0, Ordering::SeqCst);
            let held = self.full.min(max / 100 * 100);
            self.cache.store(held, Ordering::SeqCst);
            self.workers.fetch_add(RELOAD_SCRATCH, Ordering::SeqCst);
            self.check();
            self.workers.fetch_sub(RELOAD_SCRATCH, Ordering::SeqCst);
            Ok(held)
        }
        fn reload_scratch(&self, _max: u64) -> u64 {
            RELOAD_SCRATCH
        }
    }

    const RELOAD_SCRATCH: u64 = 500;

    /// A batch that would take up to `want` bytes of idle workers.
    struct FakeClaim<'a> {
        fake: &'a Fake,
        want: u64,
        taken: u64,
    }

    impl Claim for FakeClaim<'_> {
        fn available(&self) -> u64 {
            self.fake.idle_bytes().min(self.want)
        }
        fn take(&mut self) -> u64 {
            let t = self.available();
            self.fake.idle.fetch_sub(t, Ordering::SeqCst);
            self.fake.workers.fetch_add(t, Ordering::SeqCst);
            self.taken = t;
            t
        }
    }

    fn claim(fake: &Fake, want: u64) -> FakeClaim<'_> {
        FakeClaim {
            fake,
            want,
            taken: 0,
        }
    }

    #[test]
    fn a_reload_holds_its_scratch_within_the_budget() {
        // Budget 10,000: fixed 2,000, cache 6,000, 2,000 free.
        let fake = Fake::new(6_000, 8_000);
        let ledger = Ledger::new(10_000, true, 2_000, 6_000, 0);
        // Room for the load's scratch beside the whole cache.
        ledger.reload_cache(&fake);
        assert_eq!(ledger.view().cache, 6_000);
        // A search holds 1,800 of the 2,000: the reload loads 300 less.
        ledger.admit(1_800, &fake, &mut claim(&fake, 0)).unwrap();
        fake.workers.fetch_add(1_800, Ordering::SeqCst);
        ledger.reload_cache(&fake);
        assert_eq!(ledger.view().cache, 5_700);
        assert_eq!(fake.over.load(Ordering::SeqCst), 0);
        fake.workers.fetch_sub(1_800, Ordering::SeqCst);
        // The search's end takes the room back.
        ledger.release(1_800, &fake, &mut || ());
        let v = ledger.view();
        assert_eq!(v.cache, 6_000);
        assert!(v.peak <= 10_000, "peak {}", v.peak);
        // Nothing held: nothing to reload.
        let empty = Fake::new(0, 8_000);
        let ledger = Ledger::new(10_000, true, 2_000, 0, 0);
        ledger.reload_cache(&empty);
        assert_eq!(ledger.view().cache, 0);
    }

    #[test]
    fn concurrent_searches_borrow_from_the_cache_and_never_exceed_the_budget() {
        // Budget 10,000: fixed 2,000, cache 6,000, 2,000 free for workers.
        let fake = Arc::new(Fake::new(6_000, 8_000));
        let ledger = Arc::new(Ledger::new(10_000, true, 2_000, 6_000, 0));
        // Fits the free room: no borrowing.
        assert_eq!(
            ledger.admit(1_500, &*fake, &mut claim(&fake, 0)).unwrap(),
            0
        );
        ledger.release(1_500, &*fake, &mut || ());
        // 3,000: the cache lends 1,000, and takes it back afterwards.
        assert_eq!(
            ledger.admit(3_000, &*fake, &mut claim(&fake, 0)).unwrap(),
            1_000
        );
        assert_eq!(ledger.view().cache, 5_000);
        ledger.release(3_000, &*fake, &mut || ());
        let v = ledger.view();
        assert_eq!((v.cache, v.borrows, v.borrowed_peak), (6_000, 1, 1_000));
        // More than an empty cache could make room for: refused.
        let e = ledger
            .admit(8_001, &*fake, &mut claim(&fake, 0))
            .unwrap_err();
        assert!(e.to_string().contains("at least 10001"), "{e}");
        // Eight threads at once, each needing 3,000 to 5,000 (one or two
        // fit at a time with an empty cache), each taking idle workers
        // when it is admitted and handing back a third of its scratch as
        // idle workers when it ends: every one runs, none is refused, none
        // waits forever, and cache + idle + workers never exceed the
        // 8,000 the budget leaves.
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (ledger, fake) = (ledger.clone(), fake.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let need = 3_000 + 500 * (i % 5);
                        let mut c = claim(&fake, need / 2);
                        ledger.admit(need, &*fake, &mut c).unwrap();
                        fake.workers.fetch_add(need - c.taken, Ordering::SeqCst);
                        fake.check();
                        std::thread::yield_now();
                        ledger.release(need, &*fake, &mut || {
                            fake.workers.fetch_sub(need, Ordering::SeqCst);
                            fake.idle.fetch_add(need / 3, Ordering::SeqCst);
                        });
                        fake.check();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(fake.over.load(Ordering::SeqCst), 0);
        let v = ledger.view();
        assert!(v.peak <= 10_000, "{v:?}");
        assert_eq!(v.running, 0, "{v:?}");
        assert!(v.borrows > 1, "{v:?}");
    }

    #[test]
    fn an_update_layer_takes_its_room_from_the_cache_plan_not_the_workers() {
        // Budget 10,000: fixed 2,000, cache 6,000, 2,000 left, of which the
        // workers' reserve is 1,500: the first 500 the update layer takes
        // are spare, the rest comes out of the cache's plan.
        let fake = Fake::new(6_000, 8_000);
        let ledger = Ledger::new(10_000, true, 2_000, 6_000, 0).keeping(1_500);
        ledger.grow_fixed(300, &fake).unwrap();
        let v = ledger.view();
        assert_eq!((v.fixed, v.cache, v.cache_planned), (2_300, 6_000, 6_000));
        ledger.grow_fixed(700, &fake).unwrap();
        let v = ledger.view();
        assert_eq!((v.fixed, v.cache, v.cache_planned), (3_000, 5_500, 5_500));
        // The workers keep their 1,500: searches borrow nothing, and the
        // cache does not regrow past its plan after them.
        for _ in 0..5 {
            assert_eq!(ledger.admit(1_500, &fake, &mut claim(&fake, 0)).unwrap(), 0);
            ledger.release(1_500, &fake, &mut || ());
        }
        let v = ledger.view();
        assert_eq!((v.cache, v.borrows), (5_500, 0));
        // More than the cache's plan holds: the rest from the workers' room.
        ledger.grow_fixed(6_000, &fake).unwrap();
        let v = ledger.view();
        assert_eq!((v.fixed, v.cache, v.cache_planned), (9_000, 0, 0));
        assert!(ledger.grow_fixed(2_000, &fake).is_err());
        assert_eq!(ledger.view().fixed, 9_000);
        // Given back: the plan gets its room back and the cache regrows.
        ledger.shrink_fixed(7_000, &fake);
        let v = ledger.view();
        assert_eq!((v.fixed, v.cache, v.cache_planned), (2_000, 6_000, 6_000));
        assert!(v.peak <= 10_000, "{v:?}");
    }

    #[test]
    fn an_unbound_budget_admits_without_borrowing() {
        let fake = Fake::new(6_000, u64::MAX);
        let ledger = Ledger::new(10_000, false, 2_000, 6_000, 0);
        assert_eq!(
            ledger.admit(50_000, &fake, &mut claim(&fake, 0)).unwrap(),
            0
        );
        assert_eq!(ledger.view().cache, 6_000);
        ledger.release(50_000, &fake, &mut || ());
        assert_eq!(ledger.view().running, 0);
    }
}
