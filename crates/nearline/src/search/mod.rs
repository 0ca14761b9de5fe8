//! Query execution: the candidate list, the executor (one loop for every
//! layout, scorer and executor kind), page policies, neighbour scorers, the
//! worker pool that runs batches, and per-query statistics.

pub mod candidates;
pub mod entry;
pub mod executor;
pub mod params;
pub mod policy;
pub mod pool;
pub mod scorer;
pub mod stats;

pub use executor::{search_one, IndexData, Scratch};
pub use params::{
    ExecutorKind, PageSearch, RangeParams, SearchParams, DEFAULT_RANGE_RATIO, DEFAULT_SIGMA,
    MAX_BEAM_WIDTH, MAX_LIST_SIZE, MAX_QUERIES_IN_FLIGHT, QUERIES_IN_FLIGHT_AUTO,
};
pub use pool::WorkerPool;
pub use scorer::{AnyScorer, PqScorer, Scorer};
pub use stats::QueryStats;

#[cfg(test)]
mod tests;
