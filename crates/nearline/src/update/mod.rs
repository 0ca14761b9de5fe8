//! The update layer both mutable index kinds share: the write-ahead log
//! (`wal`: the closed set of logged operations, written through `io/`), a
//! reader that follows another process's log (`tail`), the id tracker and
//! the rules an insert's rows and ids are checked by (`ids`), and the
//! recovery protocol — a checkpoint plus the log after it, applied through
//! the [`recovery::Recover`] trait each kind implements (`recovery`).
//! The updaters themselves (in place: `partition`; out of place:
//! `index::fresh`) build on them.

pub mod ids;
pub mod recovery;
pub mod tail;
pub mod wal;
