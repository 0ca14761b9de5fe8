//! Query execution: the candidate list, the beam-search executor, the
//! worker pool that runs batches, and per-query statistics.

pub mod beam;
pub mod candidates;
pub mod pool;
pub mod stats;

pub use beam::{IndexData, Scratch, SearchParams};
pub use pool::WorkerPool;
pub use stats::QueryStats;
