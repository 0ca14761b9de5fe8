//! `manifest.json`: format version, the spec that built the index, dtype,
//! metric, dims, counts, the typed sections with sizes and checksums, and a
//! checksum of the manifest itself.
//!
//! Compatibility: a reader refuses a higher major version and reads any
//! minor version of its own major. Names a reader must understand to read
//! an index correctly (index kind, preset, layout, section names) are typed:
//! an index that uses one this version does not know is refused with a
//! [`Error::Version`] that says to upgrade, never read with other defaults.
//!
//! The manifest checksum (format 1.3) is the CRC32C of the manifest's JSON
//! in canonical form (keys sorted, no whitespace, the `checksum` field
//! removed), so any edit of any field — `"metric"` from `l2` to `ip`, say —
//! is a [`Error::Corrupt`]. Manifests of format 1.2 and older carry none and
//! are read as before.

pub use super::layout_kind::LayoutKind;
use super::layout_kind::{Placement, RecordFormat};
use crate::distance::Metric;
use crate::elem::DType;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Major format version: bumped on incompatible changes.
pub const FORMAT_MAJOR: u32 = 1;
/// Minor format version: bumped on backward-compatible additions.
/// 1.1: entry sections; 1.2: shuffled layouts; 1.3: index kind, typed
/// names, manifest checksum; 1.4: coded layouts (AlayaLaser) with their
/// PCA, RaBitQ and in-degree sections, and no PQ; 1.5: partition indexes
/// (kind `partition`, their own manifest fields); 1.6: a partition index's
/// entries and state file carry 32-bit versions (state magic `NLPSTAT2`;
/// 1.5's version bytes are still read); 1.7: a graph index takes updates
/// (its write-ahead log `wal.log`, merged by rewriting the index; the
/// manifest's `next_auto_id`); 1.8: PQ-coded layouts (AiSAQ: records
/// carrying their neighbours' PQ codes) and the `aisaq` preset; 1.9: a
/// graph index updated in place (the build spec's `update`, log records
/// of page images, tombstones as the external id 2**64-1); 1.10: page-graph
/// layouts (PageANN: the `page_graph` placement, page layout id 6, the
/// layout's `page_graph` summary) and the `pageann` preset; 1.11:
/// decoupled layouts (DGAI: topology records and vector pages, layout id 7,
/// vector page kind 2, the layout's `vector_blocks`) and the `dgai` preset.
pub const FORMAT_MINOR: u32 = 11;
/// First minor version whose manifests carry a checksum.
pub const CHECKSUM_MINOR: u32 = 3;
/// The `format` field every manifest carries.
pub const FORMAT_NAME: &str = "nearline-index";
/// File name of the manifest inside an index directory.
pub const MANIFEST_FILE: &str = "manifest.json";

crate::util::vocabulary! {
    /// What kind of index a directory holds. Each kind has its own sections
    /// and search; the element type is dispatched below it.
    pub enum IndexKind: "index kind" {
        /// A static disk graph (DiskANN family): Vamana graph in a page
        /// file, codes in RAM or in the records.
        Graph = "graph",
        /// A partition index (SPANN/SPFresh): postings of vectors on disk,
        /// their heads in an in-memory graph; takes inserts and deletes
        /// (format 1.5; its manifest is `partition::state`'s).
        Partition = "partition",
    }
}

crate::util::vocabulary! {
    /// A named composition of components that built an index (one per seed
    /// paper). `auto` is a request the planner resolves to one of these; it
    /// is never stored.
    pub enum Preset: "preset" {
        /// DiskANN: ID layout, medoid entry, synchronous beam search.
        Diskann = "diskann",
        /// PipeANN: navigation-graph entry, pipelined search.
        Pipeann = "pipeann",
        /// Starling: shuffled blocks, navigation graph, block search.
        Starling = "starling",
        /// Gorgeous: graph-replicated pages, adjacency-first cache,
        /// two-stage search.
        Gorgeous = "gorgeous",
        /// AlayaLaser: neighbour codes in the records (PCA + RaBitQ,
        /// FastScan), no PQ in memory, in-degree cache, cluster entry.
        Alayalaser = "alayalaser",
        /// AiSAQ: PQ codes of each node's neighbours in its record, only
        /// the codebook in memory (format 1.8).
        Aisaq = "aisaq",
        /// PageANN: a page graph (records grouped by proximity, the graph
        /// over pages), navigation graph, each page read and expanded as
        /// one node (format 1.10).
        Pageann = "pageann",
        /// DGAI: decoupled topology records and vector pages, PQ codes in
        /// memory to route, the vectors read for the final re-rank only
        /// (format 1.11).
        Dgai = "dgai",
        /// SPFresh: a partition index (SPANN postings, in-memory head
        /// graph) updated in place by LIRE, with a write-ahead log.
        Spfresh = "spfresh",
    }
}

crate::util::vocabulary! {
    /// The sections an index directory may hold (keys of `sections`).
    pub enum Section: "section" {
        /// The page file: records in blocks with per-block CRC32C.
        Pages = "pages",
        /// The PQ codebook.
        PqCodebook = "pq_codebook",
        /// PQ codes, `n × pq_bytes`.
        PqCodes = "pq_codes",
        /// External ids, u64 little-endian per node.
        Ids = "ids",
        /// The in-memory navigation graph.
        NavGraph = "nav_graph",
        /// Centroid entry points.
        EntryCentroids = "entry_centroids",
        /// Node → position map of a shuffled layout (implicit for the ID layout).
        IdToLocation = "id_to_location",
        /// Every adjacency list in node order and the order in which an
        /// adjacency cache takes nodes (Gorgeous).
        Adjacency = "adjacency",
        /// The PCA a coded layout's vectors are stored in (format 1.4).
        Pca = "pca",
        /// The RaBitQ rotation of a coded layout's principal dimensions.
        Rabitq = "rabitq",
        /// Nodes by decreasing in-degree (what an in-degree cache loads).
        InDegree = "in_degree",
    }
}

/// The parameters that built an index (kept so it can be rebuilt or inspected).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildSpec {
    pub preset: Preset,
    pub r: usize,
    pub build_l: usize,
    pub alpha: f32,
    pub passes: usize,
    /// Whether pruned lists were filled up to R (absent: false).
    #[serde(default)]
    pub saturate: bool,
    pub pq_bytes: usize,
    /// Search memory budget in bytes (sizes the node cache at open by default).
    pub memory_budget: u64,
    /// Whether the budget was sized by nearline (no budget given): searches
    /// that need more worker scratch than it holds may take it. Absent
    /// (indexes before 1.3): their budget sized the PQ codes only, so true.
    #[serde(default = "yes")]
    pub memory_budget_auto: bool,
    /// Build memory budget in bytes.
    pub build_memory_budget: u64,
    pub page_size: usize,
    pub seed: u64,
    pub threads: usize,
    /// Sampling rate of the navigation graph (absent: 0, none; format 1.1).
    #[serde(default)]
    pub nav_sample: f64,
    /// k-means centroids of the centroid entries (absent: 0, none; format 1.1).
    #[serde(default)]
    pub entry_clusters: usize,
    /// Disk budget in bytes the page file was held to (absent: 0, none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_budget: u64,
    /// How the index takes updates (absent: out of place; format 1.9).
    #[serde(default, skip_serializing_if = "UpdateMode::is_out_of_place")]
    pub update: UpdateMode,
    /// With `preset="auto"`: the rule that chose the preset, and what the
    /// build measured for it (absent: a named preset, or an index built
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_rule: Option<String>,
}

/// How a graph index takes inserts and deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateMode {
    /// FreshDiskANN: an in-memory delta merged into a new disk graph.
    #[default]
    OutOfPlace,
    /// OdinANN / IP-DiskANN: the disk graph's records are rewritten.
    InPlace,
}

impl UpdateMode {
    /// The option's spelling.
    pub fn name(self) -> &'static str {
        match self {
            UpdateMode::OutOfPlace => "out_of_place",
            UpdateMode::InPlace => "in_place",
        }
    }

    /// Parses the option (`None`: `"auto"`).
    pub fn parse(s: &str) -> std::result::Result<Option<UpdateMode>, String> {
        match s {
            "auto" => Ok(None),
            "out_of_place" => Ok(Some(UpdateMode::OutOfPlace)),
            "in_place" => Ok(Some(UpdateMode::InPlace)),
            other => Err(format!(
                "unknown update strategy {other:?}: expected \"auto\", \"in_place\" or \"out_of_place\""
            )),
        }
    }

    fn is_out_of_place(&self) -> bool {
        *self == UpdateMode::OutOfPlace
    }
}

/// How a shuffled layout was made (format 1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShuffleInfo {
    /// `"bnp"`, `"bnf"` or `"bns"`.
    pub algorithm: String,
    /// BNF's round limit β and gain threshold τ; BNS rounds.
    pub bnf_iters: usize,
    pub bnf_tau: f64,
    pub bns_iters: usize,
    /// Rounds actually run.
    pub iterations: usize,
    /// OR(G) the ID layout of the same graph would have.
    pub id_overlap_ratio: f64,
    pub seconds: f64,
}

/// Geometry of the page file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutInfo {
    /// The placement × record format, by its one-word name (`id`,
    /// `shuffled` (format 1.2), `replicated`, `coded` (1.4), `pq_coded` (1.8),
    /// `page_graph` (1.10)).
    pub kind: LayoutKind,
    pub page_size: usize,
    /// Bytes of one block (a page, or whole consecutive pages for big records).
    pub block_size: usize,
    pub record_size: usize,
    pub records_per_block: usize,
    pub n_blocks: u64,
    pub max_degree: usize,
    /// Starling's overlap ratio OR(G) of the layout (absent before 1.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_ratio: Option<f64>,
    /// How the shuffled layout was made (absent for the ID layout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<ShuffleInfo>,
    /// Neighbours' adjacency lists each record carries (graph-replicated
    /// layouts; absent: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub packed: usize,
    /// How the lists were spread over a replicated layout's records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationInfo>,
    /// The neighbour codes a coded layout's records carry (format 1.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<CodesInfo>,
    /// How a page graph's edges were chosen (format 1.10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_graph: Option<PageGraphInfo>,
    /// Vector pages after the `n_blocks` record blocks (a decoupled
    /// layout, format 1.11; absent: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vector_blocks: u64,
}

/// A page graph's edges (PageANN): each page's out-edges lead to other
/// pages, at most `records_per_block × max_degree` of them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PageGraphInfo {
    /// Out-edges a full page can hold.
    pub page_degree: usize,
    /// Mean and largest out-degree of a page.
    pub mean_degree: f64,
    pub max_degree: usize,
    /// Distinct other pages the node graph's edges led to, per page (mean):
    /// what the page edges were chosen from.
    pub mean_candidates: f64,
    /// Edges added back (to a page from a page it leads to) and edges
    /// added so every page is reachable from the start node's page.
    pub back_edges: u64,
    pub repairs: u64,
    pub seconds: f64,
}

/// The neighbour codes of a coded layout (AlayaLaser).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CodesInfo {
    /// Principal dimensions the codes cover (the rest are the residual,
    /// used only for exact distances).
    pub principal_dims: usize,
    /// Bits per dimension: 1 (RaBitQ), 2 or 4 (scalar levels of the
    /// rotated residual).
    pub bits: usize,
    /// Share of the variance the principal dimensions hold.
    pub explained_variance: f64,
}

fn is_zero<T: Default + PartialEq>(x: &T) -> bool {
    *x == T::default()
}

/// How a graph-replicated layout spread the adjacency lists (Gorgeous).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplicationInfo {
    /// Packed slots per record.
    pub packed: usize,
    /// Most records a list may be packed into besides its own.
    pub cap: usize,
    /// Packed lists over all records.
    pub packed_lists: u64,
    /// Mean number of other records a node's list appears in.
    pub mean_replicas: f64,
    /// The most other records any list appears in.
    pub max_replicas: u32,
    /// Nodes whose list appears in at least one other record.
    pub replicated_nodes: u64,
    /// Bytes of the page file the plain records (no packed lists) would take.
    pub plain_bytes: u64,
}

/// One typed section of the index directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionInfo {
    /// File name inside the index directory (empty for implicit sections).
    pub file: String,
    /// What the section holds, e.g. `"pages"`, `"pq_codes"`, `"identity"`.
    pub kind: String,
    pub bytes: u64,
    /// CRC32C of the whole file; `None` where each page carries its own.
    pub crc32c: Option<u32>,
}

/// Build statistics kept for `info`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BuildStats {
    pub seconds: f64,
    pub graph_seconds: f64,
    pub pq_seconds: f64,
    pub mean_degree: f64,
    pub shards: usize,
    /// Seconds spent on the navigation graph and centroid entries.
    #[serde(default)]
    pub entry_seconds: f64,
    /// PQ sizes tried on a sample when the build chose the PQ bytes (the
    /// smallest within tolerance was kept), with the recall each reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pq_trials: Vec<PqTrial>,
    /// Code shapes of a coded layout tried on a sample when the build chose
    /// the principal dimensions and bits (the best was kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub code_trials: Vec<CodeTrial>,
}

/// One code shape tried on a sample: the mean share of the `k` exact
/// nearest of a record's neighbours (to a sample query) that the record's
/// estimates rank in their own top `k`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CodeTrial {
    pub principal_dims: usize,
    pub bits: usize,
    pub recall: f64,
    pub k: usize,
}

/// One PQ size tried on a sample: the recall@10 of the exact neighbours
/// within the PQ ranking's top `candidates`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PqTrial {
    pub pq_bytes: usize,
    pub recall: f64,
    pub candidates: usize,
}

/// The manifest of an index directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_major: u32,
    pub format_minor: u32,
    /// What the directory holds (absent before 1.3: a graph index).
    #[serde(default = "default_kind")]
    pub kind: IndexKind,
    pub created_by: String,
    pub spec: BuildSpec,
    pub dtype: DType,
    pub metric: Metric,
    pub dim: usize,
    pub n: usize,
    pub medoid: u32,
    pub layout: LayoutInfo,
    /// Sequence number of the last write-ahead-log record applied (0: none).
    pub wal_sequence: u64,
    /// The next automatic id of a graph index that took updates: above
    /// every id it has given (0 before any merge: one above its largest).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_auto_id: u64,
    pub sections: BTreeMap<Section, SectionInfo>,
    #[serde(default)]
    pub build_stats: BuildStats,
    /// `crc32c:XXXXXXXX` of the canonical manifest without this field
    /// (format 1.3; absent before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

fn yes() -> bool {
    true
}

fn default_kind() -> IndexKind {
    IndexKind::Graph
}

impl Manifest {
    /// Parses manifest text; `path` is named in errors. Checks the format
    /// name and version, the vocabulary (index kind, preset, layout,
    /// sections: a name this version does not know is a version error), the
    /// checksum (format ≥ 1.3) and the fields' consistency.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest> {
        let mut v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::corrupt(path, format!("manifest is not valid JSON: {e}")))?;
        let format = v.get("format").and_then(|f| f.as_str());
        if format != Some(FORMAT_NAME) {
            return Err(Error::format(
                path,
                format!("field \"format\" is {format:?}, expected {FORMAT_NAME:?}: not a nearline index"),
            ));
        }
        let major = v
            .get("format_major")
            .and_then(|m| m.as_u64())
            .ok_or_else(|| {
                Error::corrupt(path, "field \"format_major\" is missing or not an integer")
            })?;
        if major > FORMAT_MAJOR as u64 {
            return Err(Error::Version {
                path: path.to_path_buf(),
                msg: format!(
                    "index format version {major}.x is newer than this reader ({FORMAT_MAJOR}.{FORMAT_MINOR}); upgrade nearline to open it"
                ),
            });
        }
        let minor = v
            .get("format_minor")
            .and_then(|m| m.as_u64())
            .ok_or_else(|| {
                Error::corrupt(path, "field \"format_minor\" is missing or not an integer")
            })?;
        // The checksum first: an edited manifest is damage, whatever it says.
        let stored = match v.as_object_mut().and_then(|o| o.remove("checksum")) {
            Some(serde_json::Value::String(c)) => Some(c),
            Some(other) => {
                return Err(Error::corrupt(
                    path,
                    format!("field \"checksum\" is {other}, expected a string \"crc32c:XXXXXXXX\""),
                ))
            }
            None => None,
        };
        match (&stored, minor >= CHECKSUM_MINOR as u64) {
            (Some(c), _) => {
                let want = checksum_of(&v);
                if *c != want {
                    return Err(Error::corrupt(
                        path,
                        format!(
                            "manifest fails its checksum (stored {c}, computed {want}): it was edited or damaged; rebuild the index"
                        ),
                    ));
                }
            }
            (None, true) => {
                return Err(Error::corrupt(
                    path,
                    format!(
                    "field \"checksum\" is missing (format {major}.{minor} manifests carry one)"
                ),
                ))
            }
            (None, false) => {}
        }
        check_vocabulary(path, &v)?;
        if v.get("kind").and_then(|k| k.as_str()) == Some(IndexKind::Partition.name()) {
            return Err(Error::format(
                path,
                "holds a partition index, not a graph index (open it with nearline's index \
                 opener, which reads either kind)",
            ));
        }
        let mut m: Manifest = serde_json::from_value(v)
            .map_err(|e| Error::corrupt(path, format!("manifest field error: {e}")))?;
        m.checksum = stored;
        m.validate(path)?;
        Ok(m)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let l = &self.layout;
        let bad = |msg: String| Err(Error::corrupt(path, msg));
        if self.dim == 0 {
            return bad("field \"dim\" is 0".into());
        }
        // Every section stores the dimension as a u32, and node ids are
        // u32 (one is kept free): a manifest beyond either was not written
        // by a build, and the sizes derived from it (the planner's memory
        // split) stay far from overflowing.
        if self.dim > u32::MAX as usize {
            return bad(format!(
                "field \"dim\" is {}, more than the {} the format can store",
                self.dim,
                u32::MAX
            ));
        }
        if self.n == 0 {
            return bad("field \"n\" is 0: an index holds at least one point".into());
        }
        if self.n > u32::MAX as usize - 1 {
            return bad(format!(
                "field \"n\" is {}, more than the {} nodes an index can hold",
                self.n,
                u32::MAX - 1
            ));
        }
        let coded = l.kind.records() == RecordFormat::Coded;
        if coded {
            // Routing distances come from the records: no PQ.
            if self.spec.pq_bytes != 0 {
                return bad(format!(
                    "field \"spec.pq_bytes\" is {}, expected 0 for a coded layout",
                    self.spec.pq_bytes
                ));
            }
            match l.codes {
                Some(c) if [1, 2, 4].contains(&c.bits) && (2..=self.dim).contains(&c.principal_dims) => {}
                other => {
                    return bad(format!(
                        "field \"layout.codes\" is {other:?}, expected 1-, 2- or 4-bit codes over 2..={} principal dimensions",
                        self.dim
                    ))
                }
            }
            if self.dtype != DType::F32 {
                return bad(format!(
                    "field \"dtype\" is {}, a coded layout stores float32 vectors",
                    self.dtype
                ));
            }
        } else if self.spec.pq_bytes == 0 || self.spec.pq_bytes > self.dim {
            return bad(format!(
                "field \"spec.pq_bytes\" is {}, expected 1..={} (the dimension)",
                self.spec.pq_bytes, self.dim
            ));
        } else if l.codes.is_some() {
            return bad(format!("layout {} carries no codes", l.kind));
        } else if l.kind.records() == RecordFormat::PqCoded
            && self.spec.pq_bytes > u16::MAX as usize
        {
            return bad(format!(
                "field \"spec.pq_bytes\" is {}, more than a PQ-coded record's slot holds",
                self.spec.pq_bytes
            ));
        }
        if ![4096, 8192, 16384].contains(&l.page_size) {
            return bad(format!(
                "field \"layout.page_size\" is {}, expected 4096, 8192 or 16384",
                l.page_size
            ));
        }
        let vector_bytes = self.dim.checked_mul(self.dtype.size()).ok_or_else(|| {
            Error::corrupt(path, format!("field \"dim\" is {}: too large", self.dim))
        })?;
        if (l.kind.records() == RecordFormat::Replicated) != (l.packed > 0) {
            return bad(format!(
                "layout {} with {} packed lists: only a replicated layout packs lists, and it packs some",
                l.kind, l.packed
            ));
        }
        let geo = if l.kind.records() == RecordFormat::Decoupled {
            super::page::PageGeometry::decoupled(l.page_size, vector_bytes, l.max_degree, self.n)
        } else if l.kind.records() == RecordFormat::PqCoded {
            super::page::PageGeometry::with_pq_codes(
                l.page_size,
                vector_bytes,
                l.max_degree,
                self.spec.pq_bytes,
                self.n,
            )
        } else {
            super::page::PageGeometry::with_regions(
                l.page_size,
                vector_bytes,
                l.max_degree,
                l.packed,
                l.codes.map_or(0, |c| c.principal_dims),
                l.codes.map_or(0, |c| c.bits),
                self.n,
            )
        }
        .map_err(|e| Error::corrupt(path, e.to_string()))?;
        if geo.record_size != l.record_size
            || geo.block_size != l.block_size
            || geo.records_per_block != l.records_per_block
            || geo.n_blocks != l.n_blocks
            || geo.vector_blocks != l.vector_blocks
        {
            return bad(format!(
                "layout fields disagree with dim={} dtype={} R={} n={}: manifest says record {} B, block {} B, {} per block, {} blocks, {} vector blocks; expected {} B, {} B, {}, {}, {}",
                self.dim, self.dtype, l.max_degree, self.n, l.record_size, l.block_size, l.records_per_block, l.n_blocks, l.vector_blocks,
                geo.record_size, geo.block_size, geo.records_per_block, geo.n_blocks, geo.vector_blocks
            ));
        }
        // No file is longer than `i64::MAX` bytes (`off_t`): a node count
        // that makes the page file longer is damage, and every size derived
        // from it (the planner's memory split) stays far from overflowing.
        let page_file = l
            .n_blocks
            .checked_add(l.vector_blocks)
            .and_then(|b| b.checked_mul(l.block_size as u64));
        if page_file.is_none_or(|b| b > i64::MAX as u64) {
            return bad(format!(
                "fields \"n\" = {} and \"layout.block_size\" = {} make a page file of {} blocks, longer than any file can be",
                self.n, l.block_size, l.n_blocks
            ));
        }
        if self.medoid as usize >= self.n {
            return bad(format!(
                "field \"medoid\" is {} but the index has {} points",
                self.medoid, self.n
            ));
        }
        let needed: &[Section] = if coded {
            &[Section::Pages, Section::Pca, Section::Rabitq]
        } else {
            &[Section::Pages, Section::PqCodebook, Section::PqCodes]
        };
        for &key in needed {
            if !self.sections.contains_key(&key) {
                return bad(format!("section {key:?} is missing from \"sections\""));
            }
        }
        if l.kind.placement().stores_positions()
            && !self.sections.contains_key(&Section::IdToLocation)
        {
            return bad(format!(
                "a {} layout needs section \"id_to_location\"",
                l.kind
            ));
        }
        for (s, info) in &self.sections {
            // Only the identity map of the ID placement is implicit. Any
            // other name is a file directly inside the index directory: a
            // damaged manifest must not make open read `/dev/zero`,
            // `../../etc/passwd` or the directory itself.
            let implicit = *s == Section::IdToLocation && l.kind.placement() == Placement::Id;
            if !(is_plain_file_name(&info.file) || (implicit && info.file.is_empty())) {
                return bad(format!(
                    "field \"sections.{}.file\" is {:?}, expected the name of a file inside the index directory (no \"/\", not \".\" or \"..\"{})",
                    s.name(),
                    info.file,
                    if implicit { "" } else { ", not empty" }
                ));
            }
            if info.bytes > i64::MAX as u64 {
                return bad(format!(
                    "field \"sections.{}.bytes\" is {}, longer than any file can be",
                    s.name(),
                    info.bytes
                ));
            }
        }
        Ok(())
    }

    /// The manifest as it is written: pretty JSON with its checksum.
    pub fn to_text(&self, path: &Path) -> Result<String> {
        let ser =
            |e: serde_json::Error| Error::format(path, format!("cannot serialise manifest: {e}"));
        let mut v = serde_json::to_value(self).map_err(ser)?;
        if let Some(o) = v.as_object_mut() {
            o.remove("checksum");
            let c = checksum_of(&serde_json::Value::Object(o.clone()));
            o.insert("checksum".into(), serde_json::Value::String(c));
        }
        serde_json::to_string_pretty(&v).map_err(ser)
    }

    /// Whether the manifest has section `s`.
    pub fn has(&self, s: Section) -> bool {
        self.sections.contains_key(&s)
    }

    /// A section by name, or a corruption error naming it.
    pub fn section(&self, path: &Path, name: Section) -> Result<&SectionInfo> {
        self.sections.get(&name).ok_or_else(|| {
            Error::corrupt(
                path,
                format!("section {:?} is missing from the manifest", name.name()),
            )
        })
    }
}

/// Re-seals manifest text edited on purpose (tests, tools): parses it,
/// recomputes the checksum over the canonical form and returns the text
/// to write. Nothing else is checked.
pub fn reseal(path: &Path, text: &str) -> Result<String> {
    let mut v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::corrupt(path, format!("manifest is not valid JSON: {e}")))?;
    let Some(o) = v.as_object_mut() else {
        return Err(Error::corrupt(path, "manifest is not a JSON object"));
    };
    o.remove("checksum");
    let c = checksum_of(&serde_json::Value::Object(o.clone()));
    o.insert("checksum".into(), serde_json::Value::String(c));
    serde_json::to_string_pretty(&v)
        .map_err(|e| Error::format(path, format!("cannot serialise manifest: {e}")))
}

/// Whether `name` names a file directly inside the index directory: not
/// empty, no path separator (so neither absolute nor reaching into another
/// directory), not `.` or `..`, no NUL.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// `crc32c:XXXXXXXX` of a manifest value in canonical form (sorted keys:
/// `serde_json`'s map is ordered; compact).
pub(crate) fn checksum_of(v: &serde_json::Value) -> String {
    let text = v.to_string();
    format!("crc32c:{:08x}", crc32c::crc32c(text.as_bytes()))
}

/// Refuses names this version does not know with a version error (they
/// come from a newer nearline), before the typed parse would call them
/// corrupt.
fn check_vocabulary(path: &Path, v: &serde_json::Value) -> Result<()> {
    fn known<T>(
        path: &Path,
        field: &str,
        value: Option<&serde_json::Value>,
        parse: impl Fn(&str) -> Result<T>,
        names: Vec<&'static str>,
    ) -> Result<()> {
        if let Some(serde_json::Value::String(s)) = value {
            if parse(s).is_err() {
                return Err(Error::Version {
                    path: path.to_path_buf(),
                    msg: format!(
                        "{field} {s:?} is not one this version of nearline knows ({}); the index was written by a newer version: upgrade nearline to open it",
                        names.join(", ")
                    ),
                });
            }
        }
        Ok(())
    }
    known(
        path,
        "index kind",
        v.get("kind"),
        IndexKind::parse,
        IndexKind::names(),
    )?;
    let spec = v.get("spec");
    known(
        path,
        "preset",
        spec.and_then(|s| s.get("preset")),
        Preset::parse,
        Preset::names(),
    )?;
    let layout = v.get("layout");
    known(
        path,
        "layout",
        layout.and_then(|l| l.get("kind")),
        LayoutKind::parse,
        LayoutKind::names(),
    )?;
    if let Some(serde_json::Value::Object(sections)) = v.get("sections") {
        for k in sections.keys() {
            known(
                path,
                "section",
                Some(&serde_json::Value::String(k.clone())),
                Section::parse,
                Section::names(),
            )?;
        }
    }
    Ok(())
}
