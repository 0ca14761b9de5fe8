//! A fake engine for tests: serves reads from memory, completes them out of
//! order after random delays, and can fail chosen or random reads.

/// Behaviour of the fake engine.
#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    /// Seed of the completion order and delays.
    pub seed: u64,
    /// A read completes only after 0..=max_delay_polls poll/wait calls.
    pub max_delay_polls: u32,
    /// Probability that a read fails with an I/O error.
    pub fail_probability: f64,
}

/// The fake engine.
pub struct FakeEngine {}
