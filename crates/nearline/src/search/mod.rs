//! Query execution: executors, worker pool, statistics.
