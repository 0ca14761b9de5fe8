//! nearline: a disk-resident approximate nearest-neighbour search engine.
//!
//! The crate follows the five-component decomposition of disk-resident graph
//! indexes (storage strategy, layout, cache, query execution, update):
//!
//! * [`data`]: vector files, element types, exact ground truth.
//! * [`distance`]: metrics and SIMD kernels with runtime dispatch.
//! * [`quant`]: k-means and product quantization.
//! * [`graph`]: Vamana graph construction (one-shot and memory-budgeted sharded).
//! * [`layout`]: the versioned index format, page files and record placement.
//! * [`io`]: aligned buffers and the I/O engines (io_uring, pread, fake).
//! * [`cache`]: what the search memory budget holds.
//! * [`search`]: executors, worker pool and per-query statistics.
//! * [`index`]: building and opening an index: the composition of the above.
//! * [`planner`]: presets and the automatic choice.

pub mod build;
pub mod cache;
pub mod data;
pub mod distance;
pub mod elem;
pub mod error;
pub mod format;
pub mod graph;
pub mod index;
pub mod io;
pub mod kernels;
pub mod layout;
pub mod partition;
pub mod planner;
pub mod quant;
pub mod search;
pub mod update;
pub mod util;

pub use distance::Metric;
pub use elem::{DType, Element};
pub use error::{Error, Result};
