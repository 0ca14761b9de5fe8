//! Query execution: runs a resolved [`SearchPlan`] (it never consults the
//! planner). The candidate list, the core query state, the executors (one
//! loop for every layout, scorer, cache, executor kind and page policy),
//! the page policies, range search, the post-traversal refine stage, the
//! neighbour scorers, the entry points, the worker pool that runs batches,
//! and per-query statistics.

pub mod candidates;
pub mod entry;
pub mod executor;
pub mod index_data;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod query;
pub mod range;
pub mod refine;
pub mod scorer;
pub mod stats;

pub use entry::{EntryPlan, EntryPoints, EntrySet};
pub use executor::{engine_depth, search_one, Scratch};
pub use index_data::IndexData;
pub use plan::{
    BeamPlan, ExecutorPlan, PagePlan, PipelinePlan, RangeParams, RefinePlan, SearchPlan,
    DEFAULT_RANGE_RATIO, DEFAULT_SIGMA, MAX_BEAM_WIDTH, MAX_LIST_SIZE, MAX_QUERIES_IN_FLIGHT,
};
pub use pool::{BatchResult, WorkerPool};
pub use query::MAX_LOADED_PER_L;
pub use scorer::{AnyScorer, CodeScratch, CodedScorer, PqRecordScorer, PqScorer, Scorer};
pub use stats::QueryStats;

#[cfg(test)]
mod tests;
