//! The read-only, shared part of an open graph index that searches need.

use super::entry::EntryPoints;
use super::scorer::AnyScorer;
use crate::cache::SharedCache;
use crate::distance::Metric;
use crate::elem::Element;
use crate::format::page::PageGeometry;
use crate::io::EngineKind;
use crate::layout::AnyLayout;
use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;

/// What a search reads: the layout, the scorer, the cache, the entry
/// points and the page file.
pub struct IndexData<T: Element> {
    /// Geometry of the page file (also `layout.geometry()`).
    pub geo: PageGeometry,
    /// Where records live.
    pub layout: AnyLayout,
    /// How neighbours are scored.
    pub scorer: AnyScorer,
    /// What memory holds besides the scorer's codes (a search reads it
    /// under a read guard; it shrinks while a search borrows its memory).
    pub cache: SharedCache,
    pub metric: Metric,
    pub dim: usize,
    pub n: usize,
    pub medoid: u32,
    pub pages_path: PathBuf,
    pub file: Arc<File>,
    pub io_kind: EngineKind,
    /// Where each query's search starts.
    pub entries: EntryPoints<T>,
    pub _elem: PhantomData<T>,
}
