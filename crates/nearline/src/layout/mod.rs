//! The index format: a directory with a manifest and typed sections; the
//! page file's page header, record placement and writer.
//!
//! A *layout* answers "where is node v and what does its page hold". The ID
//! layout (DiskANN) places node v in block `v / records_per_block`, so its
//! id→location section is the identity and is not stored; a shuffled layout
//! (Starling's block shuffling, `shuffle`) stores a position per node.

pub mod format;
pub mod page;
pub mod placement;
pub mod section;
pub mod shuffle;
pub mod writer;

pub use format::{
    BuildSpec, LayoutInfo, Manifest, SectionInfo, ShuffleInfo, FORMAT_MAJOR, FORMAT_MINOR,
};
pub use page::{PageGeometry, PAGE_HEADER_BYTES};
pub use placement::{AnyLayout, IdLayout, Layout, LayoutKind, ShuffledLayout};
