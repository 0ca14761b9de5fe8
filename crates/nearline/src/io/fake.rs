//! A fake engine for tests: serves reads from memory, completes them out of
//! order after random delays, and can fail chosen or random reads.
//!
//! Writes are supported: `submit_write` checks alignment like the real
//! engines (refused with an error, nothing queued), and the write lands in
//! the engine's copy of the data when its completion is handed back (the
//! bytes are copied on the first write if the caller still shares them, so
//! the caller's `Arc` never changes; [`FakeEngine::data`] shows the result).
//! A write past the end grows the data, zero-filling any gap. Injected
//! failures apply to writes as to reads, and a failed write changes nothing.
//! Reads and writes in flight together complete in random order, as on a
//! real disk.

use super::buffer::{check_write, AlignedBuf, ALIGN};
use super::completion::{Completion, IoCounters};
use crate::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::Arc;

/// Byte written past the end of a short read, so a caller that uses bytes it
/// was not given sees garbage instead of plausible zeros.
pub const POISON: u8 = 0xA5;

/// Behaviour of the fake engine.
#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// Seed of the completion order and delays.
    pub seed: u64,
    /// A read completes only after 0..=max_delay_polls poll/wait calls.
    pub max_delay_polls: u32,
    /// Probability that a read (or write) fails with an I/O error.
    pub fail_probability: f64,
    /// Reads (and writes) at exactly these byte offsets always fail.
    pub fail_offsets: Vec<u64>,
    /// Fail reads whose offset is not a multiple of [`ALIGN`] with `EINVAL`,
    /// as O_DIRECT does.
    pub strict_alignment: bool,
}

struct Pending {
    token: u64,
    offset: u64,
    buf: AlignedBuf,
    /// poll/wait calls still to pass before the read is ready.
    delay: u32,
    fail: bool,
    write: bool,
}

/// The fake engine.
pub struct FakeEngine {
    data: Arc<Vec<u8>>,
    opts: FakeOptions,
    rng: ChaCha8Rng,
    pending: Vec<Pending>,
    /// How many reads of each token are in flight.
    tokens: HashMap<u64, u32>,
    counters: IoCounters,
    max_in_flight: usize,
    double_completions: u64,
}

impl FakeEngine {
    /// An engine serving reads from `data`.
    pub fn new(data: Arc<Vec<u8>>, opts: FakeOptions) -> Self {
        FakeEngine {
            data,
            rng: ChaCha8Rng::seed_from_u64(opts.seed),
            opts,
            pending: Vec::new(),
            tokens: HashMap::new(),
            counters: IoCounters::default(),
            max_in_flight: 0,
            double_completions: 0,
        }
    }

    /// Queues a read; it becomes ready after a random number of poll/wait calls.
    pub fn submit(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        self.push(token, offset, buf, false);
        Ok(())
    }

    /// Queues a write of the whole of `buf` at `offset`; it is applied when
    /// its completion is handed back. Refuses misaligned arguments.
    pub fn submit_write(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        check_write(offset, buf.as_ptr() as usize, buf.len())?;
        self.push(token, offset, buf, true);
        Ok(())
    }

    fn push(&mut self, token: u64, offset: u64, buf: AlignedBuf, write: bool) {
        let delay = if self.opts.max_delay_polls == 0 {
            0
        } else {
            self.rng.random_range(0..=self.opts.max_delay_polls)
        };
        let fail = self.opts.fail_offsets.contains(&offset)
            || (self.opts.fail_probability > 0.0
                && self.rng.random::<f64>() < self.opts.fail_probability);
        self.pending.push(Pending {
            token,
            offset,
            buf,
            delay,
            fail,
            write,
        });
        *self.tokens.entry(token).or_insert(0) += 1;
        if write {
            self.counters.writes += 1;
        } else {
            self.counters.reads += 1;
        }
        self.max_in_flight = self.max_in_flight.max(self.pending.len());
    }

    /// The engine's bytes: the data it was given with every completed
    /// write applied.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Hands back up to `max` ready reads in random order, then lets one tick
    /// of time pass for the others.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let n = self.take_ready(out, max);
        self.tick();
        n
    }

    /// Lets time pass until `min(min, in_flight)` reads are ready and hands
    /// back every ready read.
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> usize {
        let need = min.min(self.pending.len());
        while self.pending.iter().filter(|p| p.delay == 0).count() < need {
            self.tick();
        }
        let n = self.take_ready(out, usize::MAX);
        self.tick();
        n
    }

    /// Reads submitted and not yet handed back.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Reads and writes ever submitted.
    pub fn submitted(&self) -> u64 {
        self.counters.reads + self.counters.writes
    }

    /// Reads and writes ever handed back.
    pub fn completed(&self) -> u64 {
        self.counters.completed
    }

    /// The largest number of reads in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Completions whose token was not in flight (always 0 unless the engine
    /// has a bug; tests assert it).
    pub fn double_completions(&self) -> u64 {
        self.double_completions
    }

    /// Running totals.
    pub fn counters(&self) -> IoCounters {
        self.counters
    }

    fn tick(&mut self) {
        for p in &mut self.pending {
            p.delay = p.delay.saturating_sub(1);
        }
    }

    fn take_ready(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let ready = self.pending.iter().filter(|p| p.delay == 0).count();
            if ready == 0 {
                break;
            }
            // Pick a random ready read: completion order is not FIFO.
            let pick = self.rng.random_range(0..ready);
            let Some(idx) = self
                .pending
                .iter()
                .enumerate()
                .filter(|(_, p)| p.delay == 0)
                .nth(pick)
                .map(|(i, _)| i)
            else {
                break;
            };
            let p = self.pending.swap_remove(idx);
            out.push(self.complete(p));
            n += 1;
        }
        n
    }

    fn complete(&mut self, p: Pending) -> Completion {
        match self.tokens.get_mut(&p.token) {
            Some(c) if *c > 1 => *c -= 1,
            Some(_) => {
                self.tokens.remove(&p.token);
            }
            None => self.double_completions += 1,
        }
        let Pending {
            token,
            offset,
            mut buf,
            fail,
            write,
            ..
        } = p;
        let result = if fail {
            Err(std::io::Error::other("injected failure"))
        } else if write {
            self.apply_write(offset, buf.as_slice())
        } else if self.opts.strict_alignment && !offset.is_multiple_of(ALIGN as u64) {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        } else {
            let len = self.data.len() as u64;
            let start = offset.min(len) as usize;
            let end = offset.saturating_add(buf.len() as u64).min(len) as usize;
            let n = end - start;
            let dst = buf.as_mut_slice();
            dst[..n].copy_from_slice(&self.data[start..end]);
            dst[n..].fill(POISON);
            Ok(n)
        };
        let c = Completion {
            token,
            buf,
            result,
            write,
        };
        self.counters.record(&c);
        c
    }

    /// Copies `bytes` into the data at `offset` (growing it as needed).
    fn apply_write(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<usize> {
        let start = usize::try_from(offset).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("fake write at byte {offset}: past the addressable range"),
            )
        })?;
        let end = start.checked_add(bytes.len()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("fake write at byte {offset}: past the addressable range"),
            )
        })?;
        let data = Arc::make_mut(&mut self.data);
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        Ok(bytes.len())
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        // Mirrors the real engines: in-flight reads are completed (and their
        // buffers released) before the engine goes away.
        let mut sink = Vec::new();
        self.wait(self.pending.len(), &mut sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(len: usize) -> Arc<Vec<u8>> {
        Arc::new((0..len).map(|i| (i * 7 % 251) as u8).collect())
    }

    #[test]
    fn completes_out_of_order() {
        let mut e = FakeEngine::new(
            data(64 * ALIGN),
            FakeOptions {
                seed: 3,
                max_delay_polls: 4,
                ..Default::default()
            },
        );
        for t in 0..32u64 {
            e.submit(t, t * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
        }
        let mut out = Vec::new();
        while e.in_flight() > 0 {
            e.poll(&mut out, 3);
        }
        let order: Vec<u64> = out.iter().map(|c| c.token).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..32).collect::<Vec<_>>());
        assert_ne!(order, sorted, "completion order should not be FIFO");
        for c in &out {
            let off = c.token as usize * ALIGN;
            assert_eq!(c.buf.as_slice(), &e.data[off..off + ALIGN]);
        }
        assert_eq!((e.submitted(), e.completed()), (32, 32));
        assert_eq!(e.max_in_flight(), 32);
        assert_eq!(e.double_completions(), 0);
    }

    #[test]
    fn delays_hold_reads_back() {
        let mut e = FakeEngine::new(
            data(4 * ALIGN),
            FakeOptions {
                seed: 11,
                max_delay_polls: 50,
                ..Default::default()
            },
        );
        for t in 0..16u64 {
            e.submit(t, 0, AlignedBuf::new(ALIGN)).unwrap();
        }
        let mut out = Vec::new();
        let first = e.poll(&mut out, usize::MAX);
        assert!(
            first < 16,
            "with delays up to 50 polls not all are ready at once"
        );
        // wait(n) returns at least n (bounded by in flight).
        let got = e.wait(5, &mut out);
        assert!(got >= 5.min(16 - first));
        e.wait(usize::MAX, &mut out);
        assert_eq!(out.len(), 16);
        assert_eq!(e.in_flight(), 0);
    }

    #[test]
    fn injected_failures() {
        let mut e = FakeEngine::new(
            data(8 * ALIGN),
            FakeOptions {
                seed: 5,
                fail_offsets: vec![2 * ALIGN as u64],
                ..Default::default()
            },
        );
        for t in 0..8u64 {
            e.submit(t, t * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
        }
        let mut out = Vec::new();
        e.wait(8, &mut out);
        for c in &out {
            if c.token == 2 {
                let err = c.result.as_ref().unwrap_err();
                assert_eq!(err.kind(), std::io::ErrorKind::Other);
                assert!(err.to_string().contains("injected failure"));
            } else {
                assert_eq!(*c.result.as_ref().unwrap(), ALIGN);
            }
        }
        assert_eq!(e.counters().errors, 1);

        let mut e = FakeEngine::new(
            data(8 * ALIGN),
            FakeOptions {
                seed: 5,
                fail_probability: 0.5,
                ..Default::default()
            },
        );
        for t in 0..200u64 {
            e.submit(t, 0, AlignedBuf::new(ALIGN)).unwrap();
        }
        let mut out = Vec::new();
        e.wait(200, &mut out);
        let failed = out.iter().filter(|c| c.result.is_err()).count();
        assert!(
            (50..150).contains(&failed),
            "{failed} of 200 failed at p=0.5"
        );
    }

    #[test]
    fn writes_land_out_of_order_and_failures_change_nothing() {
        let original = data(4 * ALIGN);
        let mut e = FakeEngine::new(
            Arc::clone(&original),
            FakeOptions {
                seed: 7,
                max_delay_polls: 3,
                fail_offsets: vec![ALIGN as u64],
                ..Default::default()
            },
        );
        let filled = |v: u8, pages: usize| {
            let mut b = AlignedBuf::new(pages * ALIGN);
            b.as_mut_slice().fill(v);
            b
        };
        // Page 1 fails; pages 2-3 and 6 (past the end: the data grows,
        // pages 4-5 zero-filled) land.
        e.submit_write(1, ALIGN as u64, filled(1, 1)).unwrap();
        e.submit_write(2, 2 * ALIGN as u64, filled(2, 2)).unwrap();
        e.submit_write(6, 6 * ALIGN as u64, filled(6, 1)).unwrap();
        assert_eq!(e.in_flight(), 3);
        let mut out = Vec::new();
        e.wait(3, &mut out);
        assert_eq!(out.len(), 3);
        for c in &out {
            assert!(c.write);
            match c.token {
                1 => assert!(c.result.is_err()),
                2 => assert_eq!(*c.result.as_ref().unwrap(), 2 * ALIGN),
                _ => assert_eq!(*c.result.as_ref().unwrap(), ALIGN),
            }
        }
        let d = e.data();
        assert_eq!(d.len(), 7 * ALIGN);
        assert_eq!(&d[..2 * ALIGN], &original[..2 * ALIGN]);
        assert!(d[2 * ALIGN..4 * ALIGN].iter().all(|&b| b == 2));
        assert!(d[4 * ALIGN..6 * ALIGN].iter().all(|&b| b == 0));
        assert!(d[6 * ALIGN..].iter().all(|&b| b == 6));
        // The caller's copy is untouched.
        assert_eq!(original.len(), 4 * ALIGN);
        // Reads see the writes.
        e.submit(9, 2 * ALIGN as u64, AlignedBuf::new(ALIGN))
            .unwrap();
        out.clear();
        e.wait(1, &mut out);
        assert!(out[0].buf.as_slice().iter().all(|&b| b == 2));
        let k = e.counters();
        assert_eq!((k.reads, k.writes, k.completed, k.errors), (1, 3, 4, 1));
        assert_eq!(k.bytes_written, 3 * ALIGN as u64);
        // Misaligned writes are refused at submission.
        assert!(e.submit_write(0, 100, filled(0, 1)).is_err());
        assert_eq!(e.in_flight(), 0);
    }

    #[test]
    fn short_read_poisons_the_tail() {
        let mut e = FakeEngine::new(data(ALIGN + 10), FakeOptions::default());
        e.submit(0, ALIGN as u64, AlignedBuf::new(ALIGN)).unwrap();
        let mut out = Vec::new();
        e.wait(1, &mut out);
        assert_eq!(*out[0].result.as_ref().unwrap(), 10);
        assert!(out[0].buf.as_slice()[10..].iter().all(|&b| b == POISON));
    }

    #[test]
    fn same_seed_same_order() {
        let run = || {
            let mut e = FakeEngine::new(
                data(16 * ALIGN),
                FakeOptions {
                    seed: 99,
                    max_delay_polls: 3,
                    ..Default::default()
                },
            );
            let mut out = Vec::new();
            for t in 0..16u64 {
                e.submit(t, t * ALIGN as u64, AlignedBuf::new(ALIGN))
                    .unwrap();
                e.poll(&mut out, 2);
            }
            e.wait(usize::MAX, &mut out);
            out.iter().map(|c| c.token).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Submit { page: u64, reuse_token: bool },
        Poll(usize),
        Wait(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u64..20, any::<bool>()).prop_map(|(page, reuse_token)| Op::Submit { page, reuse_token }),
            2 => (0usize..6).prop_map(Op::Poll),
            1 => (0usize..6).prop_map(Op::Wait),
        ]
    }

    proptest! {
        #[test]
        fn every_read_completes_once_with_its_buffer(
            seed in any::<u64>(),
            max_delay in 0u32..5,
            fail_p in 0.0f64..0.3,
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            let bytes = data(16 * ALIGN + 123);
            let mut e = FakeEngine::new(Arc::clone(&bytes), FakeOptions {
                seed,
                max_delay_polls: max_delay,
                fail_probability: fail_p,
                ..Default::default()
            });
            // Buffer address of each read in flight, by (token, id).
            let mut inflight: HashMap<usize, (u64, u64)> = HashMap::new();
            let mut next = 0u64;
            let mut submitted = 0u64;
            let mut out = Vec::new();
            let check = |out: &mut Vec<Completion>, inflight: &mut HashMap<usize, (u64, u64)>| {
                for mut c in out.drain(..) {
                    let addr = c.buf.as_mut_ptr() as usize;
                    let (token, off) = inflight.remove(&addr).expect("completion of a read not in flight");
                    assert_eq!(c.token, token);
                    if let Ok(n) = c.result {
                        let start = (off as usize).min(bytes.len());
                        let end = (off as usize + ALIGN).min(bytes.len());
                        assert_eq!(n, end - start);
                        assert_eq!(&c.buf.as_slice()[..n], &bytes[start..end]);
                    }
                }
            };
            for op in ops {
                match op {
                    Op::Submit { page, reuse_token } => {
                        let token = if reuse_token { 7 } else { next };
                        next += 1;
                        let mut buf = AlignedBuf::new(ALIGN);
                        let off = page * ALIGN as u64;
                        inflight.insert(buf.as_mut_ptr() as usize, (token, off));
                        e.submit(token, off, buf).unwrap();
                        submitted += 1;
                    }
                    Op::Poll(max) => {
                        let n = e.poll(&mut out, max);
                        prop_assert!(n <= max);
                        prop_assert_eq!(n, out.len());
                    }
                    Op::Wait(min) => {
                        let before = e.in_flight();
                        let n = e.wait(min, &mut out);
                        prop_assert!(n >= min.min(before));
                        prop_assert_eq!(n, out.len());
                    }
                }
                check(&mut out, &mut inflight);
                prop_assert_eq!(e.in_flight(), inflight.len());
                prop_assert_eq!(e.submitted(), submitted);
                prop_assert_eq!(e.completed() + e.in_flight() as u64, submitted);
            }
            e.wait(usize::MAX, &mut out);
            check(&mut out, &mut inflight);
            prop_assert!(inflight.is_empty());
            prop_assert_eq!(e.double_completions(), 0);
        }
    }
}
