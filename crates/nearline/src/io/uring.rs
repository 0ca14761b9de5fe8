//! io_uring engine: one ring per worker, O_DIRECT reads and writes.
//!
//! Reads pushed by `submit` (and writes pushed by `submit_write`: the Write
//! opcode on the same descriptor) sit in the submission queue until the
//! next `flush`, `poll` or `wait` (or until the queue is full), so the reads
//! of one beam, or the blocks of one posting write, go to the kernel in one
//! system call. Every in-flight buffer is owned by a slab slot whose index
//! is the SQE's `user_data`; the slot is emptied only when the kernel's
//! completion for it has been reaped.
//!
//! **Polling mode** (`UringEngine::polling`, `io="uring-poll"`): the ring
//! is set up with a kernel submission thread (`IORING_SETUP_SQPOLL`), so
//! handing reads to the device costs the worker no system call, and `wait`
//! spins on the completion queue for up to [`SPIN_LIMIT`] before it blocks,
//! so the worker is not put to sleep and woken for every page. On this
//! machine's virtual disk a submission's doorbell write and a sleep/wake
//! cost the worker ~12 µs and ~8 µs (perf, docs/benchmarks.md): polling
//! moves the first to the kernel thread and avoids the second, for the
//! price of a busy core per worker and one per ring's kernel thread while
//! reads flow (it sleeps after [`SQPOLL_IDLE_MS`] without work). It is for
//! low-latency serving with spare cores, never chosen automatically.

use super::buffer::{check_write, AlignedBuf};
use super::completion::{Completion, IoCounters};
use crate::{Error, Result};
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

struct Slot {
    token: u64,
    buf: AlignedBuf,
    /// File offset (a short write's error names it).
    offset: u64,
    write: bool,
}

/// Whether the file is registered with the ring by default (`types::Fixed`),
/// which spares the kernel a file-table lookup per read.
const REGISTER_FILE: bool = true;

/// Polling mode: how long `wait` spins on the completion queue before it
/// blocks in the kernel.
pub const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_millis(1);

/// Polling mode: milliseconds the kernel submission thread keeps polling
/// after its last read before it sleeps (the next submit wakes it).
pub const SQPOLL_IDLE_MS: u32 = 2;

/// The io_uring engine.
pub struct UringEngine {
    ring: IoUring,
    /// Keeps the descriptor open for as long as the ring may use it.
    file: Arc<File>,
    fixed: bool,
    /// In-flight reads by slot index; `None` = free.
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Slots in use (pushed, submitted or completed-but-not-reaped from the CQ).
    busy: usize,
    /// Completions reaped from the CQ and not yet handed to the caller.
    ready: VecDeque<Completion>,
    counters: IoCounters,
    /// Polling mode: kernel submission thread, spinning waits.
    polling: bool,
}

/// Bytes of a ring for `depth` reads in flight: the submission queue
/// entries and index array, the completion queue (twice the depth), the
/// per-read slots, and the rings' page-rounded headers.
pub fn ring_bytes(depth: usize) -> u64 {
    depth as u64 * (64 + 4 + 2 * 16 + 48) + 8192
}

impl UringEngine {
    /// Bytes this engine holds (see [`ring_bytes`]).
    pub fn memory_bytes(&self) -> u64 {
        ring_bytes(self.slots.len())
    }

    /// A ring of `max(8, depth.next_power_of_two())` entries allowing up to
    /// `depth` reads in flight.
    pub fn new(file: Arc<File>, depth: u32) -> Result<Self> {
        Self::build(file, depth, REGISTER_FILE, false)
    }

    /// [`UringEngine::new`] in polling mode (see the module docs).
    pub fn polling(file: Arc<File>, depth: u32) -> Result<Self> {
        Self::build(file, depth, REGISTER_FILE, true)
    }

    /// [`UringEngine::new`], choosing whether to register the file with the
    /// ring (falls back to a plain descriptor if registration fails).
    pub fn with_options(file: Arc<File>, depth: u32, register_file: bool) -> Result<Self> {
        Self::build(file, depth, register_file, false)
    }

    fn build(file: Arc<File>, depth: u32, register_file: bool, polling: bool) -> Result<Self> {
        if depth == 0 {
            return Err(Error::arg("io_uring depth: expected at least 1, got 0"));
        }
        let entries = depth
            .checked_next_power_of_two()
            .ok_or_else(|| Error::arg(format!("io_uring depth {depth} is too large")))?
            .max(8);
        let mut builder = IoUring::builder();
        if polling {
            builder.setup_sqpoll(SQPOLL_IDLE_MS);
        }
        let ring = builder.build(entries).map_err(|e| {
            let mode = if polling { " and a polling thread" } else { "" };
            Error::Engine(format!("io_uring setup with {entries} entries{mode}: {e}"))
        })?;
        let fixed = register_file && ring.submitter().register_files(&[file.as_raw_fd()]).is_ok();
        let depth = depth as usize;
        Ok(UringEngine {
            ring,
            file,
            fixed,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth as u32).rev().collect(),
            busy: 0,
            ready: VecDeque::with_capacity(depth),
            counters: IoCounters::default(),
            polling,
        })
    }

    /// Queues a read; it reaches the kernel at the next flush/poll/wait.
    pub fn submit(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        self.push(token, offset, buf, false)
    }

    /// Queues a write of the whole of `buf` at byte `offset` (the Write
    /// opcode on the ring's descriptor, which must be open for writing); it
    /// reaches the kernel at the next flush/poll/wait. Refuses an offset or
    /// buffer that is not aligned to [`ALIGN`](super::buffer::ALIGN) before
    /// anything is queued. A short write completes as an error.
    pub fn submit_write(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        check_write(offset, buf.as_ptr() as usize, buf.len())?;
        self.push(token, offset, buf, true)
    }

    fn push(&mut self, token: u64, offset: u64, mut buf: AlignedBuf, write: bool) -> Result<()> {
        let what = if write { "write" } else { "read" };
        let len = u32::try_from(buf.len()).map_err(|_| {
            Error::arg(format!(
                "io_uring {what} of {} bytes: expected at most {} bytes per {what}",
                buf.len(),
                u32::MAX
            ))
        })?;
        // More than `depth` in flight: reap completions into the ready queue
        // until a slot frees up.
        while self.free.is_empty() {
            self.reap();
            if self.free.is_empty() {
                self.enter(1)?;
            }
        }
        let Some(idx) = self.free.pop() else {
            return Err(Error::Engine("io_uring slot accounting broke".into()));
        };
        let ptr = buf.as_mut_ptr();
        let fd = self.file.as_raw_fd();
        let sqe = match (write, self.fixed) {
            (false, true) => opcode::Read::new(types::Fixed(0), ptr, len)
                .offset(offset)
                .build(),
            (false, false) => opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(offset)
                .build(),
            (true, true) => opcode::Write::new(types::Fixed(0), ptr.cast_const(), len)
                .offset(offset)
                .build(),
            (true, false) => opcode::Write::new(types::Fd(fd), ptr.cast_const(), len)
                .offset(offset)
                .build(),
        }
        .user_data(idx as u64);
        self.slots[idx as usize] = Some(Slot {
            token,
            buf,
            offset,
            write,
        });
        self.busy += 1;
        *self.submitted_mut(write) += 1;
        loop {
            // SAFETY: the SQE points into the heap allocation of the buffer now
            // owned by slot `idx` (the kernel writes into it for a read, reads
            // from it for a write); the slot keeps it alive (and unaliased)
            // until the completion carrying `idx` is reaped, and Drop waits
            // for every busy slot before freeing anything.
            let pushed = unsafe { self.ring.submission().push(&sqe) };
            match pushed {
                Ok(()) => return Ok(()),
                Err(_) => {
                    // SQ full: hand the queued operations to the kernel and retry.
                    if let Err(e) = self.enter(0) {
                        // Nothing of this one reached the kernel: give the slot back.
                        self.slots[idx as usize] = None;
                        self.free.push(idx);
                        self.busy -= 1;
                        *self.submitted_mut(write) -= 1;
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The counter of submitted writes or reads.
    fn submitted_mut(&mut self, write: bool) -> &mut u64 {
        if write {
            &mut self.counters.writes
        } else {
            &mut self.counters.reads
        }
    }

    /// Hands queued reads and writes to the kernel without waiting.
    pub fn flush(&mut self) -> Result<()> {
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.enter(0)
    }

    /// Submits queued reads, then appends up to `max` finished reads.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        self.flush()?;
        if self.ready.len() < max {
            self.reap();
        }
        Ok(self.hand_back(out, max))
    }

    /// Submits queued reads and blocks until `min(min, in_flight)` have
    /// finished; appends every finished read.
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let need = min.min(self.in_flight());
        self.reap();
        if self.polling && self.ready.len() < need {
            self.spin(need)?;
        }
        while self.ready.len() < need {
            let want = need - self.ready.len();
            self.enter(want)?;
            self.reap();
        }
        if !self.ring.submission().is_empty() {
            self.enter(0)?;
        }
        Ok(self.hand_back(out, usize::MAX))
    }

    /// Polling mode: hands queued reads over, then reaps the completion
    /// queue until `need` completions are ready or [`SPIN_LIMIT`] passed.
    fn spin(&mut self, need: usize) -> Result<()> {
        if !self.ring.submission().is_empty() {
            // With SQPOLL this is a system call only when the thread sleeps.
            self.enter(0)?;
        }
        let start = std::time::Instant::now();
        loop {
            // Reading the clock every 64 rounds keeps the loop on the queue.
            for _ in 0..64 {
                self.reap();
                if self.ready.len() >= need {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= SPIN_LIMIT {
                return Ok(());
            }
        }
    }

    /// Whether the engine polls (see the module docs).
    pub fn is_polling(&self) -> bool {
        self.polling
    }

    /// Reads submitted and not yet handed back.
    pub fn in_flight(&self) -> usize {
        self.busy + self.ready.len()
    }

    /// Whether the file is registered with the ring.
    pub fn fixed_file(&self) -> bool {
        self.fixed
    }

    /// Running totals.
    pub fn counters(&self) -> IoCounters {
        self.counters
    }

    fn hand_back(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let n = max.min(self.ready.len());
        for c in self.ready.drain(..n) {
            self.counters.record(&c);
            out.push(c);
        }
        n
    }

    /// Moves every CQE into the ready queue (never blocks, never drops one).
    fn reap(&mut self) {
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let idx = cqe.user_data() as usize;
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::take) else {
                // Not one of ours (cannot happen: every SQE carries a busy slot).
                continue;
            };
            self.free.push(idx as u32);
            self.busy -= 1;
            let res = cqe.result();
            let mut result = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else {
                Ok(res as usize)
            };
            if slot.write {
                result = Completion::write_result(result, slot.buf.len(), slot.offset);
            }
            self.ready.push_back(Completion {
                token: slot.token,
                buf: slot.buf,
                result,
                write: slot.write,
            });
        }
    }

    /// Submits queued SQEs and waits for `want` CQEs, retrying on EINTR and
    /// reaping on EBUSY/EAGAIN (the kernel wants CQ room first).
    fn enter(&mut self, want: usize) -> Result<()> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EBUSY) | Some(libc::EAGAIN) => {
                        let before = self.ready.len();
                        self.reap();
                        if self.ready.len() == before && self.busy == 0 {
                            return Err(Error::Engine(format!("io_uring submit: {e}")));
                        }
                        if want > 0 && self.ready.len() > before {
                            return Ok(());
                        }
                    }
                    _ => return Err(Error::Engine(format!("io_uring submit: {e}"))),
                },
            }
        }
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Every busy slot's buffer may still be written by the kernel: wait
        // for all of them before the ring and the buffers are freed.
        while self.busy > 0 {
            self.reap();
            if self.busy == 0 {
                break;
            }
            if self.enter(self.busy).is_err() {
                // The ring is unusable and the kernel may still own buffers:
                // leak them rather than risk a write into freed memory.
                for slot in self.slots.drain(..) {
                    std::mem::forget(slot);
                }
                return;
            }
        }
    }
}

// The pointers held in SQEs refer to buffers owned by `slots`; nothing is tied
// to the creating thread.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<UringEngine>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::buffer::ALIGN;
    use crate::io::engine::open_direct;
    use std::io::Write;

    fn file(pages: usize) -> (tempfile::NamedTempFile, Arc<File>, Vec<u8>) {
        let data: Vec<u8> = (0..pages * ALIGN)
            .map(|i| (i / ALIGN + i % 13) as u8)
            .collect();
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        tmp.flush().unwrap();
        let (f, _) = open_direct(tmp.path()).unwrap();
        (tmp, Arc::new(f), data)
    }

    fn engine(f: &Arc<File>, depth: u32) -> Option<UringEngine> {
        match UringEngine::new(Arc::clone(f), depth) {
            Ok(e) => Some(e),
            Err(e) => {
                eprintln!("io_uring unavailable, skipping: {e}");
                None
            }
        }
    }

    #[test]
    fn ring_size_rounds_up_to_a_power_of_two_at_least_8() {
        let (_t, f, _) = file(1);
        for (depth, entries) in [(1, 8), (3, 8), (8, 8), (9, 16), (33, 64)] {
            let Some(e) = engine(&f, depth) else { return };
            assert_eq!(e.ring.params().sq_entries(), entries, "depth {depth}");
            assert_eq!(e.slots.len(), depth as usize);
        }
    }

    #[test]
    fn poll_alone_submits_pending_reads() {
        let (_t, f, data) = file(8);
        let Some(mut e) = engine(&f, 8) else { return };
        for t in 0..5u64 {
            e.submit(t, t * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
        }
        // Lazily submitted: nothing has reached the kernel yet.
        assert_eq!(e.ring.submission().len(), 5);
        let mut out = Vec::new();
        let mut polls = 0u64;
        while out.len() < 5 && polls < 50_000_000 {
            e.poll(&mut out, 8).unwrap();
            polls += 1;
        }
        assert_eq!(out.len(), 5, "poll must submit queued reads");
        for c in &out {
            let off = c.token as usize * ALIGN;
            assert_eq!(c.buf.as_slice(), &data[off..off + ALIGN]);
        }
    }

    #[test]
    fn busy_slots_never_exceed_depth() {
        let (_t, f, data) = file(16);
        let Some(mut e) = engine(&f, 3) else { return };
        for t in 0..20u64 {
            e.submit(t, (t % 16) * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
            assert!(e.busy <= 3);
            assert_eq!(e.in_flight(), t as usize + 1);
        }
        let mut out = Vec::new();
        e.wait(20, &mut out).unwrap();
        assert_eq!(out.len(), 20);
        let mut tokens: Vec<u64> = out.iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..20).collect::<Vec<_>>());
        for c in &out {
            let off = (c.token % 16) as usize * ALIGN;
            assert_eq!(c.buf.as_slice(), &data[off..off + ALIGN]);
        }
        assert_eq!((e.busy, e.free.len(), e.in_flight()), (0, 3, 0));
    }

    #[test]
    fn poll_respects_max() {
        let (_t, f, _) = file(8);
        let Some(mut e) = engine(&f, 8) else { return };
        for t in 0..6u64 {
            e.submit(t, t * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
        }
        let mut sink = Vec::new();
        // Make sure all six are done, then take them two at a time.
        e.flush().unwrap();
        while e.ready.len() < 6 {
            e.enter(1).unwrap();
            e.reap();
        }
        let mut seen = 0;
        while seen < 6 {
            let n = e.poll(&mut sink, 2).unwrap();
            assert!(n <= 2);
            seen += n;
            assert_eq!(e.in_flight(), 6 - seen);
        }
        let k = e.counters();
        assert_eq!((k.reads, k.completed, k.bytes), (6, 6, 6 * ALIGN as u64));
    }

    #[test]
    fn plain_descriptor_works_too() {
        let (_t, f, data) = file(4);
        let Ok(mut e) = UringEngine::with_options(Arc::clone(&f), 4, false) else {
            return;
        };
        assert!(!e.fixed_file());
        e.submit(1, ALIGN as u64, AlignedBuf::new(ALIGN)).unwrap();
        let mut out = Vec::new();
        e.wait(1, &mut out).unwrap();
        assert_eq!(out[0].buf.as_slice(), &data[ALIGN..2 * ALIGN]);
    }
}
