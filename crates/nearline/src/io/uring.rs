//! io_uring engine: one ring per worker, O_DIRECT reads, no SQPOLL.

/// The io_uring engine.
pub struct UringEngine {}
