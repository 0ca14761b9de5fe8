//! Every on-disk byte of an index: the manifest (typed names, checksums),
//! the page header and record codec, and the codecs of every section (PQ
//! codebook, navigation graph, centroid entries, location map, external
//! ids). Pure encoding and decoding: reading and writing files is `io`'s,
//! placing records is `layout`'s.

pub mod adjacency;
pub mod entries;
pub mod in_degree;
pub mod layout_kind;
pub mod location;
pub mod manifest;
pub mod nav;
pub mod page;
pub mod pq;
pub mod quant;
pub mod section;

pub use layout_kind::{Placement, RecordFormat};
pub use manifest::{
    BuildSpec, BuildStats, CodeTrial, CodesInfo, IndexKind, LayoutInfo, LayoutKind, Manifest,
    PageGraphInfo, PqTrial, Preset, ReplicationInfo, Section, SectionInfo, ShuffleInfo, UpdateMode,
    FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME, MANIFEST_FILE,
};
pub use page::{PageGeometry, RecordView, PAGE_HEADER_BYTES};
