//! Record placement: the `Layout` trait (node → block and slot, block →
//! nodes, record decoding), the ID layout (DiskANN), the shuffled layout and
//! its block-shuffling algorithms (Starling), the page graph's edges
//! (PageANN, on a shuffled placement), the page-file writer and the
//! blocking record reader for open-time loads.
//!
//! The ID layout places node v in block `v / records_per_block`, so its
//! id→location section is the identity and is not stored; a shuffled
//! layout stores a position per node. Record bytes are decoded only here
//! (through [`crate::format::page`]'s codec).

pub mod page_graph;
pub mod placement;
pub mod replicate;
pub mod shuffle;
pub mod writer;

pub use crate::format::LayoutKind;
pub use placement::{AnyLayout, IdLayout, Layout, RecordReader, ShuffledLayout};
