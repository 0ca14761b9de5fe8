//! Synchronous pread fallback: `submit` performs the read, `poll` hands it back.

/// The pread engine.
pub struct PreadEngine {}
