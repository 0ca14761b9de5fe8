//! A fake engine for tests: serves reads from memory, completes them out of
//! order after random delays, and can fail chosen or random reads.

use super::buffer::{AlignedBuf, ALIGN};
use super::engine::{Completion, IoCounters};
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
    /// Probability that a read fails with an I/O error.
    pub fail_probability: f64,
    /// Reads at exactly these byte offsets always fail.
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
        });
        *self.tokens.entry(token).or_insert(0) += 1;
        self.counters.reads += 1;
        self.max_in_flight = self.max_in_flight.max(self.pending.len());
        Ok(())
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

    /// Reads ever submitted.
    pub fn submitted(&self) -> u64 {
        self.counters.reads
    }

    /// Reads ever handed back.
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
            ..
        } = p;
        let result = if fail {
            Err(std::io::Error::other("injected failure"))
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
        self.counters.record(&result);
        Completion { token, buf, result }
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
