//! Updates of a mutable index: the write-ahead log today; checkpoints,
//! recovery and the in-place and out-of-place updaters build on it.

pub mod wal;
