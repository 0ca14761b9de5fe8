//! `manifest.json`: format version, the spec that built the index, dtype,
//! metric, dims, counts and the typed sections with sizes and checksums.
//!
//! Compatibility: a reader refuses a higher major version and reads any
//! minor version of its own major (unknown fields are ignored).

use crate::data::dtype::DType;
use crate::distance::Metric;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Major format version: bumped on incompatible changes.
pub const FORMAT_MAJOR: u32 = 1;
/// Minor format version: bumped on backward-compatible additions.
pub const FORMAT_MINOR: u32 = 2;
/// The `format` field every manifest carries.
pub const FORMAT_NAME: &str = "nearline-index";
/// File name of the manifest inside an index directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The parameters that built an index (kept so it can be rebuilt or inspected).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildSpec {
    pub preset: String,
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
    /// `"id"`: node v lives in block v / records_per_block; `"shuffled"`
    /// (format 1.2): node v lives where the `id_to_location` section says.
    pub kind: String,
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
}

/// The manifest of an index directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_major: u32,
    pub format_minor: u32,
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
    pub sections: BTreeMap<String, SectionInfo>,
    #[serde(default)]
    pub build_stats: BuildStats,
}

impl Manifest {
    /// Reads and validates `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        if !dir.is_dir() {
            return Err(Error::format(
                dir,
                "not an index directory (it does not exist or is not a directory)",
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        Self::parse(&path, &text)
    }

    /// Parses manifest text; `path` is named in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest> {
        let v: serde_json::Value = serde_json::from_str(text)
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
        let m: Manifest = serde_json::from_value(v)
            .map_err(|e| Error::corrupt(path, format!("manifest field error: {e}")))?;
        m.validate(path)?;
        Ok(m)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let l = &self.layout;
        let bad = |msg: String| Err(Error::corrupt(path, msg));
        if self.dim == 0 {
            return bad("field \"dim\" is 0".into());
        }
        if l.kind != "id" && l.kind != "shuffled" {
            return Err(Error::Version {
                path: path.to_path_buf(),
                msg: format!(
                    "layout kind {:?} is not one this reader knows (id, shuffled); upgrade nearline to open it",
                    l.kind
                ),
            });
        }
        if ![4096, 8192, 16384].contains(&l.page_size) {
            return bad(format!(
                "field \"layout.page_size\" is {}, expected 4096, 8192 or 16384",
                l.page_size
            ));
        }
        let vector_bytes = self.dim.checked_mul(self.dtype.size()).ok_or_else(|| {
            Error::corrupt(
                path,
                format!(
                    "field \"dim\" is {}, too large for {} vectors",
                    self.dim, self.dtype
                ),
            )
        })?;
        let geo = super::page::PageGeometry::new(l.page_size, vector_bytes, l.max_degree, self.n)
            .map_err(|e| Error::corrupt(path, e.to_string()))?;
        if geo.record_size != l.record_size
            || geo.block_size != l.block_size
            || geo.records_per_block != l.records_per_block
            || geo.n_blocks != l.n_blocks
        {
            return bad(format!(
                "layout fields disagree with dim={} dtype={} R={} n={}: manifest says record {} B, block {} B, {} per block, {} blocks; expected {} B, {} B, {}, {}",
                self.dim, self.dtype, l.max_degree, self.n, l.record_size, l.block_size, l.records_per_block, l.n_blocks,
                geo.record_size, geo.block_size, geo.records_per_block, geo.n_blocks
            ));
        }
        if self.n > 0 && self.medoid as usize >= self.n {
            return bad(format!(
                "field \"medoid\" is {} but the index has {} points",
                self.medoid, self.n
            ));
        }
        for key in ["pages", "pq_codebook", "pq_codes"] {
            if !self.sections.contains_key(key) {
                return bad(format!("section {key:?} is missing from \"sections\""));
            }
        }
        Ok(())
    }

    /// Writes the manifest to `dir/manifest.json` (via a temporary file and rename).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        let tmp = dir.join(".manifest.json.tmp");
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::format(&path, format!("cannot serialise manifest: {e}")))?;
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
        Ok(())
    }

    /// A section by name, or a corruption error naming it.
    pub fn section(&self, path: &Path, name: &str) -> Result<&SectionInfo> {
        self.sections.get(name).ok_or_else(|| {
            Error::corrupt(
                path,
                format!("section {name:?} is missing from the manifest"),
            )
        })
    }
}
