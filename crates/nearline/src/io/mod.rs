//! The I/O engine: owned aligned buffers, O_DIRECT files and the engines
//! behind one contract (`submit` / `poll` / `wait`).
//!
//! Contract:
//! * `submit(token, offset, buf)` queues a read of `buf.len()` bytes at byte
//!   `offset`; the engine owns `buf` until the read's completion is reaped.
//! * `submit_write(token, offset, buf)` queues a write of all of `buf` at
//!   byte `offset`; offset, length and buffer address are multiples of 4 KiB
//!   (O_DIRECT's rule) or the call is refused with an error and nothing is
//!   queued. Its completion (`write: true`) hands `buf` back with
//!   `Ok(buf.len())` or an error: a short write is an error, never a smaller
//!   count. The engine writes the bytes it is given: the caller makes them
//!   whole checksummed blocks, and syncs the file when it needs durability.
//!   The file must be open for writing ([`open_direct_rw`]); read-only index
//!   files are opened with [`open_direct`].
//! * `poll(out, max)` appends up to `max` finished reads and writes without
//!   blocking.
//! * `wait(min, out)` blocks until at least `min` of them (bounded by the
//!   number in flight) have finished and appends them.
//! * Dropping an engine first waits for everything in flight, so no buffer
//!   is ever freed while the kernel may still use it.
//!
//! Engines: io_uring (one ring per worker; writes use the Write opcode on
//! the same descriptor), pread (synchronous fallback, pwrite for writes,
//! chosen when io_uring cannot be set up or forced with
//! `NEARLINE_IO=pread`), and a fake engine for tests that completes out of
//! order, with delays, can fail reads and writes, and applies writes to its
//! in-memory copy of the data.
//!
//! [`durable`] is the write path of the write-ahead log and of the page
//! file an in-place update patches (a positioned write and a data sync; in
//! tests, `faulty::FaultyFile` fails, tears and loses them).
//!
//! [`blocks`] reads single blocks for open-time loads, [`files`] reads and
//! writes an index directory's manifest and sections (checked, durable).
//! [`ceiling`] measures the disk's random-read rate through the same engine
//! (the benchmark's same-run reference).

pub mod blocks;
pub mod buffer;
pub mod ceiling;
pub mod completion;
pub mod durable;
pub mod engine;
pub mod fake;
#[cfg(test)]
pub mod faulty;
pub mod files;
pub mod pread;
pub mod staging;
#[cfg(target_os = "linux")]
pub mod uring;

pub use blocks::BlockReader;
pub use buffer::{AlignedBuf, BufferPool, ALIGN};
pub use ceiling::{measure_read_ceiling, CeilingOptions, CeilingReport};
pub use completion::{Completion, IoCounters};
pub use durable::DurableFile;
pub use engine::{open_direct, open_direct_rw, EngineKind, IoEngine};
pub use fake::{FakeEngine, FakeOptions};
