//! What a partition index keeps on disk besides its postings: the manifest
//! (`manifest.json`, kind `partition`) and the checkpoint state file it
//! names (`state-G.bin`: heads, posting map, version map, ids, free blocks).
//!
//! # State file (little-endian), CRC32C of everything before the last 4 bytes at the end
//!
//! | field | |
//! |---|---|
//! | magic `NLPSTAT2` | 8 bytes |
//! | dim, head slots, head start | u32 each |
//! | alive flags | one byte per head slot |
//! | head vectors | slots × dim × f32 |
//! | head lists | per slot: u32 count, count × u32 |
//! | freed head slots | u32 count, count × u32 |
//! | postings | per head slot: u32 entries, u32 blocks, blocks × u32 |
//! | ids | u32 n, n × u32 version word, n × u64 external id |
//! | next automatic id | u64 |
//! | blocks in the postings file, free blocks | u32, u32 count, count × u32 |
//! | CRC32C | u32 |
//!
//! A version word holds the slot's version in its low 31 bits and
//! [`DELETED`] in its top bit. Format 1.5 and older wrote magic `NLPSTATE`
//! and a version byte per slot (7 bits and a deleted flag); they are read
//! as the same versions.

use super::store::PostingRef;
use crate::distance::Metric;
use crate::elem::DType;
use crate::format::{IndexKind, Preset};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// State file magic.
pub const STATE_MAGIC: [u8; 8] = *b"NLPSTAT2";
/// Magic of the state files of format 1.5 and older (version bytes).
pub const STATE_MAGIC_V1: [u8; 8] = *b"NLPSTATE";

/// Version-word flag of a deleted id.
pub const DELETED: u32 = 1 << 31;
/// Version bits of a version word.
pub const VERSION_MASK: u32 = DELETED - 1;
/// The highest version a slot takes. Versions only grow: a re-insert into a
/// freed slot takes its version + 2 (a move cut short by the delete may
/// have written entries at + 1), a move + 1. A slot whose next re-insert
/// would pass this is never reused, so a version never wraps around to one
/// that a stale entry still carries.
pub const MAX_VERSION: u32 = VERSION_MASK - 2;

/// The parameters a partition index was built with (and updates follow).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionParams {
    /// Entries a posting may hold before it is split (LIRE) or
    /// garbage-collected (append-only).
    pub posting_limit: usize,
    /// The share of `posting_limit` a build fills a posting to (replicas
    /// beyond it are cut), so that inserts find room before a split (1.0
    /// for indexes built before it was kept).
    #[serde(default = "full")]
    pub build_fill: f64,
    /// Live entries below which a posting is merged away.
    pub merge_threshold: usize,
    /// Most postings a vector is stored in (RNG rule).
    pub replicas: usize,
    /// RNG rule factor: posting `j` is skipped when a chosen posting `i`
    /// has `rng_factor · d(c_i, c_j) < d(x, c_j)`.
    pub rng_factor: f32,
    /// SPANN's closure: besides the RNG rule's choices, a vector goes into
    /// every posting whose head lies within (1 + closure) of its nearest
    /// head's distance (up to `replicas` postings). 0: the RNG rule alone.
    #[serde(default)]
    pub closure: f32,
    /// Postings near a split whose vectors are checked for reassignment.
    pub reassign_k: usize,
    /// LIRE (split, merge, reassign); `false`: SPANN+ (appends and
    /// garbage collection only).
    pub lire: bool,
    /// Heads at build over vectors.
    pub head_ratio: f64,
    /// Search memory budget, bytes.
    pub memory_budget: u64,
    /// Whether the budget was sized by nearline.
    pub memory_budget_auto: bool,
    pub seed: u64,
    /// The recall@10 the build calibrated the default `nprobe` for
    /// (`None`: an index built before calibration).
    #[serde(default)]
    pub recall_target: Option<f64>,
    /// Postings a search reads by default, as the build calibrated it
    /// (`None`: [`super::DEFAULT_NPROBE`]).
    #[serde(default)]
    pub nprobe: Option<usize>,
}

fn full() -> f64 {
    1.0
}

impl PartitionParams {
    /// Entries a build puts in a posting at most (its primaries may pass
    /// it): `build_fill` of the limit.
    pub fn build_cap(&self) -> usize {
        ((self.posting_limit as f64 * self.build_fill).floor() as usize).max(1)
    }
}

/// Build statistics kept for `info`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PartitionBuildStats {
    pub seconds: f64,
    pub cluster_seconds: f64,
    pub assign_seconds: f64,
    pub write_seconds: f64,
    pub postings: usize,
    /// Entries over vectors: the replication kept (after the posting limit).
    pub mean_replicas: f64,
    /// Vectors by the number of postings the assignment chose for them
    /// (index: count of postings; before the posting limit).
    #[serde(default)]
    pub replicas_chosen: Vec<u64>,
    /// Replica entries the posting limit cut.
    #[serde(default)]
    pub replicas_cut: u64,
    /// Entries per posting at the build.
    #[serde(default)]
    pub posting_sizes: Histogram,
    /// How the default `nprobe` was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<super::calibrate::Calibration>,
}

/// A summary of counts: extremes, mean and power-of-two buckets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    /// `(upper bound, how many)`: values in (previous bound, bound]; the
    /// first bucket holds 0 and 1.
    pub buckets: Vec<(u64, u64)>,
}

impl Histogram {
    /// The histogram of `values`.
    pub fn of(values: &[usize]) -> Histogram {
        if values.is_empty() {
            return Histogram::default();
        }
        let max = values.iter().copied().max().unwrap_or(0) as u64;
        let min = values.iter().copied().min().unwrap_or(0) as u64;
        let mean = values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
        let mut buckets: Vec<(u64, u64)> = Vec::new();
        let mut bound = 1u64;
        loop {
            buckets.push((bound, 0));
            if bound >= max {
                break;
            }
            bound = bound.saturating_mul(2);
        }
        let last = buckets.len() - 1;
        for &v in values {
            let v = v as u64;
            let i = if v <= 1 {
                0
            } else {
                (64 - (v - 1).leading_zeros()) as usize
            };
            if let Some(b) = buckets.get_mut(i.min(last)) {
                b.1 += 1;
            }
        }
        Histogram {
            min,
            max,
            mean,
            buckets,
        }
    }
}

/// The manifest of a partition index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionManifest {
    pub format: String,
    pub format_major: u32,
    pub format_minor: u32,
    pub kind: IndexKind,
    pub created_by: String,
    pub preset: Preset,
    pub dtype: DType,
    pub metric: Metric,
    pub dim: usize,
    pub params: PartitionParams,
    /// The checkpoint: its state file, size and CRC32C.
    pub state_file: String,
    pub state_bytes: u64,
    pub state_crc32c: u32,
    /// Checkpoints taken (the state file's number).
    pub generation: u64,
    /// Last write-ahead-log sequence the checkpoint holds.
    pub wal_sequence: u64,
    /// Live vectors at the checkpoint.
    pub n: usize,
    #[serde(default)]
    pub build_stats: PartitionBuildStats,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

impl PartitionManifest {
    /// The manifest as written: pretty JSON with its checksum.
    pub fn to_text(&self, path: &Path) -> Result<String> {
        let ser =
            |e: serde_json::Error| Error::format(path, format!("cannot serialise manifest: {e}"));
        let mut v = serde_json::to_value(self).map_err(ser)?;
        if let Some(o) = v.as_object_mut() {
            o.remove("checksum");
            let c = crate::format::manifest::checksum_of(&serde_json::Value::Object(o.clone()));
            o.insert("checksum".into(), serde_json::Value::String(c));
        }
        serde_json::to_string_pretty(&v).map_err(ser)
    }

    /// Parses and checks manifest text (`path` is named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<PartitionManifest> {
        let mut v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::corrupt(path, format!("manifest is not valid JSON: {e}")))?;
        let stored = match v.as_object_mut().and_then(|o| o.remove("checksum")) {
            Some(serde_json::Value::String(c)) => c,
            _ => {
                return Err(Error::corrupt(
                    path,
                    "field \"checksum\" is missing or not a string",
                ))
            }
        };
        let want = crate::format::manifest::checksum_of(&v);
        if stored != want {
            return Err(Error::corrupt(
                path,
                format!("manifest fails its checksum (stored {stored}, computed {want}): it was edited or damaged"),
            ));
        }
        let mut m: PartitionManifest = serde_json::from_value(v)
            .map_err(|e| Error::corrupt(path, format!("manifest field error: {e}")))?;
        m.checksum = Some(stored);
        let bad = |msg: String| Err(Error::corrupt(path, msg));
        if m.kind != IndexKind::Partition {
            return bad(format!("kind is {}, expected partition", m.kind.name()));
        }
        if m.dim == 0 || m.dim > u32::MAX as usize {
            return bad(format!("field \"dim\" is {}", m.dim));
        }
        if m.dtype != DType::F32 {
            return bad(format!(
                "dtype {} (partition indexes store float32)",
                m.dtype.name()
            ));
        }
        let p = &m.params;
        if p.posting_limit == 0
            || p.replicas == 0
            || p.merge_threshold >= p.posting_limit
            || !(p.build_fill > 0.0 && p.build_fill <= 1.0)
        {
            return bad(format!(
                "params are inconsistent: posting_limit {}, merge_threshold {}, replicas {}, \
                 build_fill {}",
                p.posting_limit, p.merge_threshold, p.replicas, p.build_fill
            ));
        }
        if m.state_file.contains('/') || m.state_file.is_empty() {
            return bad(format!(
                "state file name {:?} is not a plain file name",
                m.state_file
            ));
        }
        Ok(m)
    }
}

/// The checkpointed in-memory structures.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub dim: usize,
    pub head_alive: Vec<bool>,
    pub head_vecs: Vec<f32>,
    pub head_lists: Vec<Vec<u32>>,
    pub head_start: u32,
    pub head_free: Vec<u32>,
    /// One per head slot (`None` for dead heads).
    pub postings: Vec<Option<PostingRef>>,
    /// Version words ([`DELETED`], [`VERSION_MASK`]), one per slot.
    pub versions: Vec<u32>,
    pub external: Vec<u64>,
    pub next_auto_id: u64,
    pub blocks_end: u32,
    pub free_blocks: Vec<u32>,
}

fn put32(b: &mut Vec<u8>, x: u32) {
    b.extend_from_slice(&x.to_le_bytes());
}

impl State {
    /// The file bytes.
    pub fn encode(&self) -> Vec<u8> {
        let slots = self.head_alive.len();
        let mut b = Vec::with_capacity(64 + slots * (self.dim * 4 + 64) + self.versions.len() * 12);
        b.extend_from_slice(&STATE_MAGIC);
        put32(&mut b, self.dim as u32);
        put32(&mut b, slots as u32);
        put32(&mut b, self.head_start);
        b.extend(self.head_alive.iter().map(|&a| a as u8));
        for x in &self.head_vecs[..slots * self.dim] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        for l in &self.head_lists {
            put32(&mut b, l.len() as u32);
            for &x in l {
                put32(&mut b, x);
            }
        }
        put32(&mut b, self.head_free.len() as u32);
        for &x in &self.head_free {
            put32(&mut b, x);
        }
        for p in &self.postings {
            match p {
                Some(p) => {
                    put32(&mut b, p.count);
                    put32(&mut b, p.blocks.len() as u32);
                    for &x in &p.blocks {
                        put32(&mut b, x);
                    }
                }
                None => {
                    put32(&mut b, u32::MAX);
                    put32(&mut b, 0);
                }
            }
        }
        put32(&mut b, self.versions.len() as u32);
        for &v in &self.versions {
            put32(&mut b, v);
        }
        for &e in &self.external {
            b.extend_from_slice(&e.to_le_bytes());
        }
        b.extend_from_slice(&self.next_auto_id.to_le_bytes());
        put32(&mut b, self.blocks_end);
        put32(&mut b, self.free_blocks.len() as u32);
        for &x in &self.free_blocks {
            put32(&mut b, x);
        }
        let c = crc32c::crc32c(&b);
        put32(&mut b, c);
        b
    }

    /// Parses and checks state file bytes.
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<State> {
        let corrupt = |msg: String| Error::corrupt(path, msg);
        if bytes.len() < STATE_MAGIC.len() + 4
            || (bytes[..8] != STATE_MAGIC && bytes[..8] != STATE_MAGIC_V1)
        {
            return Err(corrupt(
                "not a partition state file (bad magic or too short)".into(),
            ));
        }
        let version_bytes = bytes[..8] == STATE_MAGIC_V1;
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        if stored != crc32c::crc32c(body) {
            return Err(corrupt("state file fails its checksum".into()));
        }
        let mut c = Cursor {
            b: body,
            at: 8,
            path,
        };
        let dim = c.u32()? as usize;
        let slots = c.u32()? as usize;
        let head_start = c.u32()?;
        let head_alive: Vec<bool> = c.take(slots)?.iter().map(|&x| x != 0).collect();
        let n_vals = slots
            .checked_mul(dim)
            .ok_or_else(|| corrupt("head count overflows".into()))?;
        let raw = c.take(
            n_vals
                .checked_mul(4)
                .ok_or_else(|| corrupt("head count overflows".into()))?,
        )?;
        let head_vecs: Vec<f32> = raw
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        let mut head_lists = Vec::with_capacity(slots);
        for _ in 0..slots {
            let n = c.u32()? as usize;
            let l = c.u32s(n)?;
            if l.iter().any(|&x| x as usize >= slots) {
                return Err(corrupt(
                    "a head list names a head that does not exist".into(),
                ));
            }
            head_lists.push(l);
        }
        let nf = c.u32()? as usize;
        let head_free = c.u32s(nf)?;
        let mut postings = Vec::with_capacity(slots);
        for _ in 0..slots {
            let count = c.u32()?;
            let nb = c.u32()? as usize;
            if count == u32::MAX {
                postings.push(None);
            } else {
                let blocks = c.u32s(nb)?;
                postings.push(Some(PostingRef { blocks, count }));
            }
        }
        let n = c.u32()? as usize;
        let versions: Vec<u32> = if version_bytes {
            c.take(n)?
                .iter()
                .map(|&b| (b as u32 & 0x7f) | if b & 0x80 != 0 { DELETED } else { 0 })
                .collect()
        } else {
            c.u32s(n)?
        };
        let ext = c.take(
            n.checked_mul(8)
                .ok_or_else(|| corrupt("id count overflows".into()))?,
        )?;
        let external = ext
            .chunks_exact(8)
            .map(|x| u64::from_le_bytes(x.try_into().unwrap_or([0; 8])))
            .collect();
        let next_auto_id = c.u64()?;
        let blocks_end = c.u32()?;
        let nfb = c.u32()? as usize;
        let free_blocks = c.u32s(nfb)?;
        if c.at != body.len() {
            return Err(corrupt(format!(
                "{} bytes follow the state",
                body.len() - c.at
            )));
        }
        if (head_start as usize) >= slots.max(1) && slots > 0 {
            return Err(corrupt("the head graph's start does not exist".into()));
        }
        Ok(State {
            dim,
            head_alive,
            head_vecs,
            head_lists,
            head_start,
            head_free,
            postings,
            versions,
            external,
            next_auto_id,
            blocks_end,
            free_blocks,
        })
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                Error::corrupt(
                    self.path,
                    format!("state file is truncated at byte {}", self.at),
                )
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let s = self.take(8)?;
        Ok(u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
    }
    fn u32s(&mut self, n: usize) -> Result<Vec<u32>> {
        let s = self
            .take(n.checked_mul(4).ok_or_else(|| {
                Error::corrupt(self.path, "a count in the state file overflows")
            })?)?;
        Ok(s.chunks_exact(4)
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> State {
        State {
            dim: 2,
            head_alive: vec![true, false, true],
            head_vecs: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            head_lists: vec![vec![2], vec![], vec![0]],
            head_start: 0,
            head_free: vec![],
            postings: vec![
                Some(PostingRef {
                    blocks: vec![0, 1],
                    count: 5,
                }),
                None,
                Some(PostingRef {
                    blocks: vec![7],
                    count: 1,
                }),
            ],
            versions: vec![0, DELETED, 3, 0x7654_3210],
            external: vec![10, 11, 12, 13],
            next_auto_id: 14,
            blocks_end: 8,
            free_blocks: vec![2, 3],
        }
    }

    #[test]
    fn a_histogram_buckets_by_powers_of_two() {
        let h = Histogram::of(&[0, 1, 2, 3, 4, 5, 8, 9, 100]);
        assert_eq!((h.min, h.max), (0, 100));
        assert!((h.mean - 132.0 / 9.0).abs() < 1e-9);
        assert_eq!(
            h.buckets,
            vec![
                (1, 2),
                (2, 1),
                (4, 2),
                (8, 2),
                (16, 1),
                (32, 0),
                (64, 0),
                (128, 1)
            ]
        );
        assert_eq!(Histogram::of(&[]), Histogram::default());
        assert_eq!(Histogram::of(&[0]).buckets, vec![(1, 1)]);
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let s = sample();
        let b = s.encode();
        let p = Path::new("state-1.bin");
        assert_eq!(State::decode(p, &b).unwrap(), s);
        for at in (0..b.len()).step_by(3) {
            let mut d = b.clone();
            d[at] ^= 1;
            assert!(State::decode(p, &d).is_err(), "flip at {at}");
        }
        for len in 0..b.len() {
            assert!(State::decode(p, &b[..len]).is_err(), "truncated to {len}");
        }
    }

    #[test]
    fn a_state_file_of_format_1_5_reads_its_version_bytes() {
        // Format 1.5 wrote magic NLPSTATE and one byte per version.
        let mut s = sample();
        s.versions = vec![0, 0x7f | DELETED, 3, 0x45];
        let new = s.encode();
        let ids_at = new.len() - 4 - 4 - 4 - 4 * 2 - 8 - 8 * 4 - 4 * 4;
        let mut old = Vec::new();
        old.extend_from_slice(&STATE_MAGIC_V1);
        old.extend_from_slice(&new[8..ids_at]);
        old.extend_from_slice(&[0, 0xff, 3, 0x45]);
        old.extend_from_slice(&new[ids_at + 16..new.len() - 4]);
        let c = crc32c::crc32c(&old);
        old.extend_from_slice(&c.to_le_bytes());
        assert_eq!(State::decode(Path::new("state-1.bin"), &old).unwrap(), s);
    }
}
