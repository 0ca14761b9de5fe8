//! Updates of a mutable index: the write-ahead log and a reader that
//! follows another process's log; checkpoints, recovery and the in-place
//! and out-of-place updaters build on them.

pub mod tail;
pub mod wal;
