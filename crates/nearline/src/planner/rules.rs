//! The seed papers' decision rules, each a small function that returns its
//! choice and the reason, so a plan can say why it is what it is.

use super::options::{CacheChoice, EntryChoice, ExecutorChoice, PageChoice};
use super::preset::{CacheKind, PresetExecutor, AUTO_QUERIES_IN_FLIGHT};
use crate::format::{LayoutKind, PageGeometry, RecordFormat};
use crate::graph::sharded::{
    estimate_build_bytes_on, plan_graph_build, shard_capacity, GraphBuild,
};
use crate::quant::pq::PQ_MAX_BYTES;
use crate::{Error, Result};

/// DiskANN's rule for PQ bytes per vector: `floor(bytes / n)` (the codes
/// fill what the budget leaves them), clamped to `[1, min(dim, 512)]`.
pub fn pq_bytes_for_budget(n: usize, dim: usize, bytes: u64) -> usize {
    let hi = dim.clamp(1, PQ_MAX_BYTES);
    if n == 0 {
        return hi;
    }
    let per = bytes / n as u64;
    (per.min(hi as u64) as usize).max(1)
}

/// Dimensions per byte of the neighbour codes a PQ-coded record aims for:
/// `ceil(dim / 4)` bytes, the size that ranks well enough (the rule that
/// keeps `gorgeous` from coarser codes, [`super::auto`]).
pub const RECORD_PQ_DIMS_PER_BYTE: usize = 4;

/// The most a PQ-coded record's block may grow over a plain record's for
/// its codes to reach `ceil(dim / RECORD_PQ_DIMS_PER_BYTE)` bytes.
pub const RECORD_PQ_MAX_BLOCK_GROWTH: usize = 2;

/// PQ bytes of the neighbour codes a PQ-coded record (AiSAQ) carries,
/// unless asked for. The codes that fit the block a plain record needs
/// cost no extra read: when they reach `ceil(dim / 4)` bytes, the most of
/// them (at most the dimension). Else `ceil(dim / 4)`, or as much of it as
/// a record fits in twice the plain block: on wordnet-minilm (384-d, R 64)
/// at 5% of the raw bytes, the 35 bytes a 4 KiB record holds reached recall
/// 0.95 at L ≈ 72 (884 QPS, 2 threads), the 96 bytes of an 8 KiB record at
/// L 30 (1,444 QPS): a coarse code costs more hops than a larger read.
pub fn record_pq_bytes(
    given: Option<usize>,
    page_size: usize,
    vec_bytes: usize,
    r: usize,
    dim: usize,
    n: usize,
) -> Result<(usize, String)> {
    let hi = dim.clamp(1, PQ_MAX_BYTES);
    if let Some(m) = given {
        if m == 0 || m > hi {
            return Err(Error::arg(format!(
                "pq_bytes={m} must be in 1..={hi} (at most the dimension, {PQ_MAX_BYTES} at most)"
            )));
        }
        PageGeometry::with_pq_codes(page_size, vec_bytes, r, m, n)?;
        return Ok((m, "asked for".into()));
    }
    let plain = PageGeometry::new(page_size, vec_bytes, r, n)?;
    let room = |block: usize| {
        (block.saturating_sub(crate::format::page::PAGE_HEADER_BYTES + plain.record_size)
            / r.max(1))
        .min(hi)
    };
    let want = dim.div_ceil(RECORD_PQ_DIMS_PER_BYTE).clamp(1, hi);
    let free = room(plain.block_size);
    if free >= want {
        return Ok((
            free,
            format!(
                "AiSAQ: the most PQ bytes a neighbour whose record (R={r} codes) still fits the \
                 {}-byte block a plain record needs (at least dim/{RECORD_PQ_DIMS_PER_BYTE}), so \
                 the codes cost no extra read",
                plain.block_size
            ),
        ));
    }
    let grown = RECORD_PQ_MAX_BLOCK_GROWTH * plain.block_size;
    let m = want.min(room(grown)).max(free).max(1);
    let g = PageGeometry::with_pq_codes(page_size, vec_bytes, r, m, n)?;
    Ok((
        m,
        format!(
            "AiSAQ: the plain record's {}-byte block leaves {free} bytes a neighbour, below \
             dim/{RECORD_PQ_DIMS_PER_BYTE} = {want} (coarser codes cost more hops than a larger \
             read); {m} bytes, a {}-byte block (at most {RECORD_PQ_MAX_BLOCK_GROWTH}× the plain one)",
            plain.block_size, g.block_size
        ),
    ))
}

/// Most of what a budget leaves beyond its minimum that the update reserve
/// may keep from the PQ codes.
pub const MAX_UPDATE_RESERVE: f64 = 0.5;

/// The share of what a graph index's budget leaves beyond its minimum (the
/// structures and one query per worker) that the build keeps from the PQ
/// codes and the workers' interleaving, for the update delta, given the
/// workload's expected share of writes: the write ratio itself, at most
/// [`MAX_UPDATE_RESERVE`].
///
/// Why: an out-of-place index (FreshDiskANN) holds its inserts in memory
/// until a merge, and the delta's share is what the budget leaves beyond its
/// minimum (`planner::update_share`). PQ codes sized by DiskANN's rule fill a
/// tight budget (at 20% of wordnet's raw bytes a reopened index had 53 KB for
/// its delta and refused inserts; with a write ratio of 0.2 it took 4,000 in
/// 9.2 s: docs/benchmarks.md, "The workload hint `write_ratio`"), so a
/// workload that writes needs room kept at build. The write ratio sets the trade: each
/// point of writes moves a point of that room from code precision (fewer PQ
/// bytes, more reads per query) to fewer, larger merges. Capped at half so
/// routing keeps most of its codes.
pub fn update_reserve(write_ratio: f64) -> f64 {
    write_ratio.clamp(0.0, MAX_UPDATE_RESERVE)
}

/// The executor kinds a plan can resolve to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorKind {
    Beam,
    Pipeline,
}

/// The executor a search runs, never `Auto`.
///
/// Asked for explicitly: that one (beam-only options with the pipeline are
/// an error). `Auto` with a beam-only option (adaptive width, early
/// dispatch): the beam, which those options configure. Otherwise the
/// preset's executor when it names one; else seed 002's rule: with fewer
/// than two records per block a search is I/O-driven (each read yields one
/// record, so keeping the device busy matters most) and the pipeline wins;
/// with two or more it is compute-driven and the synchronous beam wins.
pub fn choose_executor(
    choice: ExecutorChoice,
    preset: PresetExecutor,
    records_per_block: usize,
    beam_options: bool,
) -> Result<(ExecutorKind, String)> {
    Ok(match choice {
        ExecutorChoice::Beam => (ExecutorKind::Beam, "asked for".into()),
        ExecutorChoice::Pipeline if beam_options => {
            return Err(Error::arg(
                "adaptive_beam and early_dispatch apply to the beam executor, not to \
                 executor=\"pipeline\" (the pipeline adapts its width by itself)",
            ))
        }
        ExecutorChoice::Pipeline => (ExecutorKind::Pipeline, "asked for".into()),
        ExecutorChoice::Auto if beam_options => (
            ExecutorKind::Beam,
            "a beam-only option (adaptive_beam, early_dispatch) was given".into(),
        ),
        ExecutorChoice::Auto => match preset {
            PresetExecutor::Beam => (ExecutorKind::Beam, "the preset's".into()),
            PresetExecutor::Pipeline => (ExecutorKind::Pipeline, "the preset's".into()),
            PresetExecutor::ByRule if records_per_block < 2 => (
                ExecutorKind::Pipeline,
                format!(
                    "seed 002: {records_per_block} record per page makes the search I/O-bound, \
                     where the pipeline wins"
                ),
            ),
            PresetExecutor::ByRule => (
                ExecutorKind::Beam,
                format!(
                    "seed 002: {records_per_block} records per page make the search \
                     compute-bound, where the synchronous beam wins"
                ),
            ),
        },
    })
}

/// What a search does with an arrived page, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    Targets,
    Block,
    Replicas,
}

/// σ of the block search a default search on `placement` runs (`None`: it
/// runs none): the preset's on shuffled blocks; 1 on a page graph, whose
/// page is one node (every record expanded, or the page's edges are not).
pub fn block_sigma(placement: crate::format::Placement, preset_sigma: f32) -> Option<f32> {
    use crate::format::Placement;
    match placement {
        Placement::Id => None,
        Placement::Shuffled => Some(preset_sigma),
        Placement::PageGraph => Some(1.0),
    }
}

/// The page policy of a search. `Auto`: Starling's block search on a
/// shuffled layout, whose pages hold a node's neighbours; Gorgeous'
/// replicas on a replicated layout, whose records carry neighbours' lists;
/// the target records on the ID layout. Replicas on a layout that packs no
/// lists is an error.
pub fn choose_page(choice: PageChoice, layout: LayoutKind) -> Result<(PageKind, String)> {
    if layout == LayoutKind::PAGE_GRAPH && !matches!(choice, PageChoice::Auto | PageChoice::Block) {
        return Err(Error::arg(format!(
            "page_search=\"{}\" does not apply to a page_graph layout: a page is one graph \
             node whose edges are spread over its records, so every record of a page read is \
             expanded (block search; use \"block\" or \"auto\")",
            choice.name()
        )));
    }
    Ok(match choice {
        PageChoice::Targets => (PageKind::Targets, "asked for".into()),
        PageChoice::Block if layout.records().carries_codes() => {
            return Err(Error::arg(format!(
                "page_search=\"block\" does not apply to a {layout} layout: its routing \
                 distances come from the expanded record's codes, so co-located records cannot \
                 be scored (use \"targets\" or \"auto\")"
            )))
        }
        PageChoice::Block if layout.records() == RecordFormat::Decoupled => {
            return Err(Error::arg(
                "page_search=\"block\" does not apply to a decoupled layout: block search ranks \
                 a page's other records by their vectors, and a topology record holds none (use \
                 \"targets\" or \"auto\")",
            ))
        }
        PageChoice::Block => (PageKind::Block, "asked for".into()),
        PageChoice::Replicas if layout.records() != RecordFormat::Replicated => {
            return Err(Error::arg(format!(
                "page_search=\"replicas\" needs a replicated layout (its records carry \
                 neighbours' lists); this index's layout is {layout} (build with \
                 preset=\"gorgeous\" or layout=\"replicated\")"
            )))
        }
        PageChoice::Replicas => (PageKind::Replicas, "asked for".into()),
        PageChoice::Auto => match layout {
            LayoutKind::SHUFFLED => (
                PageKind::Block,
                "Starling: a shuffled page holds the node's neighbours".into(),
            ),
            LayoutKind::PAGE_GRAPH => (
                PageKind::Block,
                "PageANN: a page is one graph node, every record of it expanded (sigma 1)".into(),
            ),
            LayoutKind::Replicated => (
                PageKind::Replicas,
                "Gorgeous: a replicated record carries its nearest neighbours' lists".into(),
            ),
            LayoutKind::ID => (
                PageKind::Targets,
                "DiskANN: an ID-layout page holds unrelated nodes".into(),
            ),
            LayoutKind::Coded => (
                PageKind::Targets,
                "AlayaLaser: one record per read, its neighbours scored from its codes".into(),
            ),
            LayoutKind::PqCoded => (
                PageKind::Targets,
                "AiSAQ: one record per read, its neighbours scored from their PQ codes in it"
                    .into(),
            ),
            LayoutKind::Decoupled => (
                PageKind::Targets,
                "DGAI: a topology page in ID order holds unrelated nodes' lists".into(),
            ),
        },
    })
}

/// Bits per dimension of a coded layout's codes: the most of 1, 2 and 4
/// whose record still fits the block that 1-bit codes need (finer routing
/// at no extra read), unless asked for.
pub fn code_bits(
    asked: Option<usize>,
    page_size: usize,
    vec_bytes: usize,
    r: usize,
    dims: usize,
    n: usize,
) -> Result<(usize, String)> {
    if let Some(b) = asked {
        if ![1, 2, 4].contains(&b) {
            return Err(Error::arg(format!(
                "code_bits={b} must be 1, 2 or 4 (bits per dimension of the neighbour codes)"
            )));
        }
        return Ok((b, "asked for".into()));
    }
    let one = PageGeometry::with_codes(page_size, vec_bytes, r, dims, 1, n)?;
    let mut best = 1;
    for b in [2, 4] {
        let g = PageGeometry::with_codes(page_size, vec_bytes, r, dims, b, n)?;
        if g.block_size == one.block_size && g.records_per_block == one.records_per_block {
            best = b;
        }
    }
    Ok((
        best,
        format!(
            "the most bits per dimension (of 1, 2, 4) whose records fit the {}-byte blocks \
             ({} per block) that 1-bit codes need: finer routing at no extra read",
            one.block_size, one.records_per_block
        ),
    ))
}

/// The code shapes a build may choose among (see
/// `build::codes::CodeSelection`): `rule` (the shape the rules above give)
/// first, then for each of 1, 2 and 4 bits the most principal dimensions
/// (`dim`, or a multiple of 32 of at least 64) whose records fit the blocks
/// `rule`'s records take, so the choice never costs a read.
pub fn code_shapes(
    page_size: usize,
    vec_bytes: usize,
    r: usize,
    dim: usize,
    n: usize,
    rule: (usize, usize),
) -> Result<Vec<(usize, usize)>> {
    let base = PageGeometry::with_codes(page_size, vec_bytes, r, rule.0, rule.1, n)?;
    let mut grid: Vec<usize> = (2..=dim / 32).map(|k| 32 * k).collect();
    if !grid.contains(&dim) {
        grid.push(dim);
    }
    let mut out = vec![rule];
    for bits in [1, 2, 4] {
        let mut best = None;
        for &p in &grid {
            let g = PageGeometry::with_codes(page_size, vec_bytes, r, p, bits, n)?;
            if g.block_size == base.block_size && g.records_per_block == base.records_per_block {
                best = Some(p);
            }
        }
        if let Some(p) = best {
            if !out.contains(&(p, bits)) {
                out.push((p, bits));
            }
        }
    }
    Ok(out)
}

/// Principal dimensions of a coded layout's codes: AlayaLaser's 256 when
/// d ≥ 256, else every dimension (the codes then cover the whole vector).
pub fn principal_dims(asked: Option<usize>, dim: usize) -> Result<(usize, String)> {
    match asked {
        Some(p) if p < 2 || p > dim => Err(Error::arg(format!(
            "principal_dims={p} must be in 2..={dim} (the dimension)"
        ))),
        Some(p) => Ok((p, "asked for".into())),
        None if dim >= 256 => Ok((
            256,
            "AlayaLaser: 256 principal dimensions when d ≥ 256 (the residual ones only refine \
             exact distances)"
                .into(),
        )),
        None => Ok((dim, "AlayaLaser: every dimension when d < 256".into())),
    }
}

/// The cache an open loads. `Auto`: the preset's; an adjacency cache
/// needs the index's adjacency section, and without one `auto` falls back
/// to whole records (asking for it is an error naming the fix).
pub fn resolve_cache(
    choice: CacheChoice,
    preset: CacheKind,
    has_adjacency: bool,
    has_in_degree: bool,
) -> Result<(CacheKind, String)> {
    Ok(match choice {
        CacheChoice::InDegree if !has_in_degree => {
            return Err(Error::arg(
                "cache=\"in_degree\": this index has no in-degree section; rebuild it with \
                 preset=\"alayalaser\"",
            ))
        }
        CacheChoice::InDegree => (CacheKind::InDegree, "asked for".into()),
        CacheChoice::Auto if preset == CacheKind::InDegree && has_in_degree => (
            CacheKind::InDegree,
            "AlayaLaser: whole records of the highest in-degree nodes".into(),
        ),
        CacheChoice::Auto if preset == CacheKind::InDegree => (
            CacheKind::Bfs,
            "the index has no in-degree section: whole records, breadth-first".into(),
        ),
        CacheChoice::Bfs => (CacheKind::Bfs, "asked for".into()),
        CacheChoice::Adjacency if !has_adjacency => {
            return Err(Error::arg(
                "cache=\"adjacency\": this index has no adjacency section; rebuild it with \
                 preset=\"gorgeous\" or adjacency=True (CLI: --adjacency)",
            ))
        }
        CacheChoice::Adjacency => (CacheKind::Adjacency, "asked for".into()),
        CacheChoice::Auto => match preset {
            CacheKind::Adjacency if has_adjacency => (
                CacheKind::Adjacency,
                "Gorgeous: memory holds the graph before vectors".into(),
            ),
            CacheKind::Adjacency => (
                CacheKind::Bfs,
                "the index has no adjacency section: whole records, breadth-first".into(),
            ),
            CacheKind::Bfs | CacheKind::InDegree => (
                CacheKind::Bfs,
                "DiskANN: whole records, breadth-first from the entry point".into(),
            ),
        },
    })
}

/// Gorgeous' page size: the smallest of 4, 8 and 16 KiB in which a record
/// carries at least one neighbour's list besides its own (4 KiB for most
/// vectors, larger ones for ≥ 1024-d float).
pub fn replicated_page_size(vec_bytes: usize, r: usize, n: usize) -> (usize, String) {
    for p in [4096, 8192, 16384] {
        if PageGeometry::with_packed(p, vec_bytes, r, 1, n)
            .is_ok_and(|g| g.records_per_block >= 1 && g.block_size == p)
        {
            return (
                p,
                format!("Gorgeous: the smallest page whose record of {vec_bytes} vector bytes and R={r} packs a neighbour's list"),
            );
        }
    }
    (
        16384,
        "Gorgeous: the largest page (no page packs a neighbour's list for these records)".into(),
    )
}

/// Packed lists per record of a replicated layout: as many as one page per
/// node holds (Gorgeous' C − 1, C counting the node's own list), fewer when
/// `disk_budget` bytes cannot hold that page file (a smaller record may
/// share its page). `Ok(0)`: plain records are all the budget holds.
pub fn choose_packed(
    page_size: usize,
    vec_bytes: usize,
    r: usize,
    n: usize,
    disk_budget: Option<u64>,
) -> Result<(usize, String)> {
    let fits_page = |p: usize| {
        PageGeometry::with_packed(page_size, vec_bytes, r, p, n)
            .is_ok_and(|g| g.records_per_block >= 1 && g.block_size == page_size)
    };
    let mut max = 0;
    while max < 4096 && fits_page(max + 1) {
        max += 1;
    }
    let Some(budget) = disk_budget else {
        return Ok((
            max,
            format!("Gorgeous: every list slot a {page_size}-byte page leaves after the record"),
        ));
    };
    let bytes = |p: usize| {
        PageGeometry::with_packed(page_size, vec_bytes, r, p, n)
            .map_or(u64::MAX, |g| g.file_bytes())
    };
    let plain = bytes(0);
    if plain > budget {
        return Err(Error::arg(format!(
            "disk_budget={budget} bytes is below the {plain} bytes the page file takes without \
             replication (n={n}, {vec_bytes} vector bytes, R={r}, {page_size}-byte pages); \
             give disk_budget of at least {plain}"
        )));
    }
    let p = (0..=max).rev().find(|&p| bytes(p) <= budget).unwrap_or(0);
    Ok((
        p,
        format!(
            "the most lists per record (of {max}) whose page file ({} bytes) fits \
             disk_budget={budget}",
            bytes(p)
        ),
    ))
}

/// Queries each of `threads` workers interleaves for a batch of `nq`:
/// `requested` when given, else [`AUTO_QUERIES_IN_FLIGHT`], fewer when the
/// batch does not give every worker that many.
///
/// A batch call returns when its last query ends, so the latency of one
/// query inside it is not the caller's to see; what interleaving buys is
/// throughput: one worker with one query leaves the device idle while it
/// computes, and a beam of W = 4 keeps only 4 reads in flight; four queries
/// per worker keep 16 and let one query compute while the others wait
/// (measured in docs/benchmarks.md, "queries in flight"). A lone query (or
/// one per worker) gets 1: no interleaving, lowest latency.
pub fn choose_queries_in_flight(
    requested: Option<usize>,
    nq: usize,
    threads: usize,
) -> (usize, String) {
    match requested {
        Some(q) => (q, "asked for".into()),
        None => {
            let per_worker = nq.div_ceil(threads.max(1));
            let q = per_worker.clamp(1, AUTO_QUERIES_IN_FLIGHT);
            let why = if q == AUTO_QUERIES_IN_FLIGHT {
                format!("auto: {AUTO_QUERIES_IN_FLIGHT} per worker keep the device busy")
            } else {
                format!("auto: the batch gives each of {threads} workers {q}")
            };
            (q, why)
        }
    }
}

/// The entry-point kinds an open resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Medoid,
    Sampled,
    Nav,
    Centroids,
}

/// Resolves `choice` for an index that has (or lacks) a navigation graph
/// and centroid entries; asking for a kind the index lacks is an error
/// naming the option that provides it.
pub fn resolve_entry(
    choice: EntryChoice,
    has_nav: bool,
    has_centroids: bool,
    entry_points: usize,
) -> Result<(EntryKind, String)> {
    let resolved = match choice {
        EntryChoice::Auto if has_nav => (
            EntryKind::Nav,
            "auto: the index has a navigation graph (Starling, PipeANN)".to_string(),
        ),
        EntryChoice::Auto if has_centroids => (
            EntryKind::Centroids,
            "auto: the index has centroid entries (AlayaLaser)".into(),
        ),
        EntryChoice::Auto if entry_points > 0 => (
            EntryKind::Sampled,
            format!("auto: entry_points={entry_points} asks for sampled entries"),
        ),
        EntryChoice::Auto => (
            EntryKind::Medoid,
            "auto: the index has no in-memory entry structure (DiskANN)".into(),
        ),
        EntryChoice::Nav if !has_nav => {
            return Err(Error::arg(
                "entry=\"nav\": this index has no navigation graph; rebuild it with nav_sample > 0 (CLI: --nav-sample, e.g. 0.01)",
            ))
        }
        EntryChoice::Centroids if !has_centroids => {
            return Err(Error::arg(
                "entry=\"centroids\": this index has no centroid entries; rebuild it with entry_clusters > 0 (CLI: --entry-clusters, e.g. 300)",
            ))
        }
        EntryChoice::Sampled if entry_points == 0 => {
            return Err(Error::arg(
                "entry=\"sampled\" needs entry_points > 0 (the number of sampled nodes held in memory)",
            ))
        }
        EntryChoice::Medoid => (EntryKind::Medoid, "asked for".into()),
        EntryChoice::Sampled => (EntryKind::Sampled, "asked for".into()),
        EntryChoice::Nav => (EntryKind::Nav, "asked for".into()),
        EntryChoice::Centroids => (EntryKind::Centroids, "asked for".into()),
    };
    if entry_points > 0 && resolved.0 != EntryKind::Sampled && choice != EntryChoice::Auto {
        return Err(Error::arg(format!(
            "entry_points={entry_points} applies to entry=\"sampled\" only, not entry={:?}",
            choice.name()
        )));
    }
    Ok(resolved)
}

/// Why a graph index of layout `layout` takes no updates at all (`None`:
/// it takes them, in place or out of place).
pub fn update_refusal(layout: crate::format::LayoutKind) -> Option<String> {
    (layout.placement() == crate::format::Placement::PageGraph).then(|| {
        format!(
            "its layout is {:?}: a page's records hold the page's edges to other pages, not \
             their own lists, so neither an in-place write nor a merge can place a vector in \
             it (PageANN is static); build with layout=\"shuffled\" (preset starling) to \
             update",
            layout.name()
        )
    })
}

/// Why a graph index of layout `layout` with cache `cache` cannot be
/// updated in place (`None`: it can).
pub fn in_place_refusal(
    layout: crate::format::LayoutKind,
    cache: crate::planner::preset::CacheKind,
) -> Option<String> {
    use crate::format::Placement;
    if layout.records() == RecordFormat::Decoupled {
        return Some(format!(
            "its layout is {:?}: its vector pages follow the topology pages, so an in-place \
             insert has no room to append a record (DGAI's in-place updates, topology records \
             patched apart from the vectors, are not built); it is updated out of place",
            layout.name()
        ));
    }
    if layout.records() != RecordFormat::Plain {
        return Some(format!(
            "its layout is {:?}: its {} records carry other nodes' data (replicated lists or \
             neighbour codes), which an in-place write would leave stale; it is updated out \
             of place",
            layout.name(),
            layout.records()
        ));
    }
    if let Some(why) = update_refusal(layout) {
        return Some(why);
    }
    if layout.placement() != Placement::Id {
        return Some(format!(
            "its layout is {:?}: a {} placement puts a node beside its graph neighbours, which \
             an in-place insert into a free slot would not keep; it is updated out of place",
            layout.name(),
            layout.placement()
        ));
    }
    if cache == crate::planner::preset::CacheKind::Adjacency {
        return Some("its adjacency cache holds lists an in-place update would leave stale".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Preset;
    use crate::planner::PresetChoice;

    #[test]
    fn presets_resolve() {
        assert_eq!(
            PresetChoice::parse("DiskANN").unwrap(),
            PresetChoice::Named(Preset::Diskann)
        );
        assert_eq!(
            PresetChoice::parse("PipeANN").unwrap(),
            PresetChoice::Named(Preset::Pipeann)
        );
        let e = PresetChoice::parse("bogus").unwrap_err().to_string();
        assert!(
            e.contains("unknown preset") && e.contains("diskann, pipeann"),
            "{e}"
        );
    }

    /// The numbers of the report: 20,000 × 64 float32 at R 64 on 2
    /// threads with 32 PQ bytes (the default build of that data).
    fn plan_20k(budget: &str) -> Result<super::super::PlannedBuild> {
        let opts = super::super::BuildOptions {
            threads: Some(2),
            pq_bytes: Some(32),
            build_memory_budget: Some(crate::util::Budget::parse(budget).unwrap()),
            ..Default::default()
        };
        let facts = super::super::DataFacts {
            n: 20_000,
            dim: 64,
            dtype: crate::elem::DType::F32,
        };
        super::super::plan_build(&opts, &facts)
    }

    /// The least budget an error names.
    fn stated_need(msg: &str) -> u64 {
        let at = msg.find("needs at least ").expect(msg) + "needs at least ".len();
        msg[at..]
            .split(' ')
            .next()
            .and_then(|x| x.parse().ok())
            .expect(msg)
    }

    /// A build budget no plan fits is refused before the build runs, with
    /// the budget as given (never the graph's share of it, never 0 for a
    /// small one) and the least budget that does fit: above the budget, and
    /// one that plans.
    #[test]
    fn too_small_build_budgets_state_the_real_need() {
        for (given, bytes) in [("8MB", 8_000_000u64), ("1KB", 1_000), ("0", 0)] {
            let e = plan_20k(given).unwrap_err().to_string();
            assert!(
                e.contains(&format!("build_memory_budget={bytes} bytes is too small")),
                "{e}"
            );
            let need = stated_need(&e);
            assert!(need > bytes && need > 8_000_000, "{e}");
            assert!(e.contains("640000 for the PQ codes"), "{e}");
            // The need is exact: it plans, and a byte less does not.
            let p = plan_20k(&need.to_string()).unwrap();
            let shards = p
                .decisions
                .iter()
                .find(|d| d.what == "graph_shards")
                .unwrap();
            assert!(shards.value.parse::<usize>().unwrap() >= 3, "{shards:?}");
            let e = plan_20k(&(need - 1).to_string()).unwrap_err().to_string();
            assert_eq!(stated_need(&e), need);
        }
    }

    /// A budget that shards the graph into small parts plans, with a warning
    /// that names the shards, their size and the budgets that avoid it; a
    /// budget that holds the build at once (or none) plans no shards and
    /// no warning.
    #[test]
    fn small_shards_come_with_a_warning() {
        let p = plan_20k("10MB").unwrap();
        let d = p
            .decisions
            .iter()
            .find(|d| d.what == "graph_shards")
            .unwrap();
        assert_eq!(d.value, "133", "{d:?}");
        assert!(d.rule.starts_with("sharded"), "{d:?}");
        assert_eq!(p.warnings.len(), 1);
        let w = &p.warnings[0];
        assert!(
            w.contains("133 shards of at most 361 points")
                && w.contains("build_memory_budget=10000000 bytes"),
            "{w}"
        );
        // The budgets it names: the first gives shards of SMALL_SHARD_POINTS
        // or more without a warning, a byte less still warns.
        let named: Vec<u64> = w
            .split("build_memory_budget=")
            .skip(2)
            .chain(w.rsplit(", ").next())
            .filter_map(|x| x.split(' ').next()?.parse().ok())
            .collect();
        assert_eq!(named.len(), 2, "{w}");
        let (enough, at_once) = (named[0], named[1]);
        assert!(plan_20k(&enough.to_string()).unwrap().warnings.is_empty());
        assert_eq!(
            plan_20k(&(enough - 1).to_string()).unwrap().warnings.len(),
            1
        );
        let one = plan_20k(&at_once.to_string()).unwrap();
        let d = one
            .decisions
            .iter()
            .find(|d| d.what == "graph_shards")
            .unwrap();
        assert_eq!(d.value, "1", "{d:?}");
        assert!(one.warnings.is_empty());
        let d = plan_20k(&(at_once - 1).to_string()).unwrap();
        let d = d
            .decisions
            .iter()
            .find(|d| d.what == "graph_shards")
            .unwrap();
        assert_ne!(d.value, "1", "{d:?}");
        let none = super::super::plan_build(
            &super::super::BuildOptions::default(),
            &super::super::DataFacts {
                n: 20_000,
                dim: 64,
                dtype: crate::elem::DType::F32,
            },
        )
        .unwrap();
        assert!(none.warnings.is_empty());
        assert!(none
            .decisions
            .iter()
            .any(|d| d.what == "graph_shards" && d.value == "1"));
    }

    #[test]
    fn replication_fills_the_page_within_the_disk_budget() {
        // 128-d float, R 64: 13 lists per 4 KiB page (the node's own and 12
        // packed), as in the Gorgeous paper.
        assert_eq!(choose_packed(4096, 512, 64, 1000, None).unwrap().0, 12);
        let bytes = |p| {
            PageGeometry::with_packed(4096, 512, 64, p, 1000)
                .unwrap()
                .file_bytes()
        };
        let plain = bytes(0);
        for budget in [plain, plain * 2, plain * 3, bytes(12)] {
            let (p, _) = choose_packed(4096, 512, 64, 1000, Some(budget)).unwrap();
            assert!(bytes(p) <= budget);
            assert!(p == 12 || bytes(p + 1) > budget, "{p} at {budget}");
        }
        assert!(choose_packed(4096, 512, 64, 1000, Some(plain - 1)).is_err());
        // 384-d float packs fewer; 1024-d float needs 8 KiB pages.
        assert_eq!(replicated_page_size(1536, 64, 10).0, 4096);
        assert_eq!(replicated_page_size(4096, 64, 10).0, 8192);
    }

    #[test]
    fn record_pq_bytes_fill_the_plain_block_or_grow_it() {
        // 384-d float32, R 64: a plain record takes 1,796 of a page's 4,080
        // bytes, leaving 35 a neighbour, below 384/4: the block doubles and
        // the codes take 96.
        let (m, why) = record_pq_bytes(None, 4096, 1536, 64, 384, 1000).unwrap();
        assert_eq!(m, 96, "{why}");
        let g = PageGeometry::with_pq_codes(4096, 1536, 64, m, 1000).unwrap();
        assert_eq!((g.block_size, g.records_per_block), (8192, 1));
        // 768-d: twice the plain block holds 75 bytes a neighbour, below 192.
        let (m, why) = record_pq_bytes(None, 4096, 3072, 64, 768, 1000).unwrap();
        assert_eq!(m, 75, "{why}");
        let g = PageGeometry::with_pq_codes(4096, 3072, 64, m, 1000).unwrap();
        assert_eq!(g.block_size, 8192);
        // 128-d: the plain page holds 51 bytes a neighbour, above 128/4.
        let (m, _) = record_pq_bytes(None, 4096, 512, 64, 128, 1000).unwrap();
        assert_eq!(m, 51);
        assert_eq!(
            PageGeometry::with_pq_codes(4096, 512, 64, m, 1000)
                .unwrap()
                .block_size,
            4096
        );
        // Low dimension: at most one byte a dimension.
        assert_eq!(record_pq_bytes(None, 4096, 64, 32, 16, 10).unwrap().0, 16);
        assert_eq!(record_pq_bytes(Some(8), 4096, 64, 32, 16, 10).unwrap().0, 8);
        assert!(record_pq_bytes(Some(17), 4096, 64, 32, 16, 10).is_err());
        assert!(record_pq_bytes(Some(0), 4096, 64, 32, 16, 10).is_err());
    }

    #[test]
    fn pq_bytes_follow_diskann_rule() {
        assert_eq!(pq_bytes_for_budget(1_000_000, 128, 32_000_000), 32);
        assert_eq!(pq_bytes_for_budget(1_000_000, 128, 1), 1);
        assert_eq!(pq_bytes_for_budget(10, 2048, u64::MAX), 512);
        assert_eq!(pq_bytes_for_budget(10, 64, u64::MAX), 64);
    }

    #[test]
    fn auto_queries_in_flight_follows_the_batch() {
        let q = |r, nq, t| choose_queries_in_flight(r, nq, t).0;
        // Explicit values are kept.
        assert_eq!(q(Some(1), 10_000, 2), 1);
        assert_eq!(q(Some(9), 1, 1), 9);
        // Auto: a full batch interleaves 4 per worker...
        assert_eq!(q(None, 10_000, 2), 4);
        assert_eq!(q(None, 8, 2), 4);
        // ...fewer when the batch cannot fill every worker's slots...
        assert_eq!(q(None, 5, 2), 3);
        assert_eq!(q(None, 2, 2), 1);
        // ...and a single query never interleaves.
        assert_eq!(q(None, 1, 1), 1);
        assert_eq!(q(None, 1, 0), 1);
        assert_eq!(q(None, 0, 4), 1);
    }

    #[test]
    fn auto_executor_follows_records_per_block() {
        use ExecutorChoice::*;
        use ExecutorKind::{Beam as B, Pipeline as P};
        let by = PresetExecutor::ByRule;
        let c = |ch, pre, rpb, opt| choose_executor(ch, pre, rpb, opt).unwrap().0;
        assert_eq!(c(Auto, by, 1, false), P);
        assert_eq!(c(Auto, by, 2, false), B);
        assert_eq!(c(Auto, by, 30, false), B);
        assert_eq!(c(Auto, by, 1, true), B);
        assert_eq!(c(Auto, PresetExecutor::Pipeline, 30, false), P);
        assert_eq!(c(Auto, PresetExecutor::Pipeline, 30, true), B);
        assert_eq!(c(Beam, by, 1, false), B);
        assert_eq!(c(Pipeline, by, 30, false), P);
        let e = choose_executor(Pipeline, by, 30, true).unwrap_err();
        assert!(e.to_string().contains("adaptive_beam"), "{e}");
    }

    #[test]
    fn entry_kinds_resolve() {
        use EntryChoice::*;
        let r = |c, nav, cen, ep| resolve_entry(c, nav, cen, ep).map(|x| x.0);
        assert_eq!(r(Auto, true, true, 0).unwrap(), EntryKind::Nav);
        assert_eq!(r(Auto, false, true, 0).unwrap(), EntryKind::Centroids);
        assert_eq!(r(Auto, false, false, 0).unwrap(), EntryKind::Medoid);
        assert_eq!(r(Auto, false, false, 8).unwrap(), EntryKind::Sampled);
        assert_eq!(r(Medoid, true, true, 0).unwrap(), EntryKind::Medoid);
        assert_eq!(r(Sampled, true, true, 8).unwrap(), EntryKind::Sampled);
        let e = r(Nav, false, true, 0).unwrap_err().to_string();
        assert!(e.contains("nav_sample"), "{e}");
        let e = r(Centroids, true, false, 0).unwrap_err().to_string();
        assert!(e.contains("entry_clusters"), "{e}");
        let e = r(Sampled, true, true, 0).unwrap_err().to_string();
        assert!(e.contains("entry_points"), "{e}");
        let e = r(Nav, true, true, 5).unwrap_err().to_string();
        assert!(e.contains("entry_points"), "{e}");
        assert!(EntryChoice::parse("bogus")
            .unwrap_err()
            .to_string()
            .contains("centroids"));
    }

    #[test]
    fn page_policy_follows_the_layout() {
        let page = |c, l| choose_page(c, l).unwrap().0;
        assert_eq!(
            page(PageChoice::Auto, LayoutKind::SHUFFLED),
            PageKind::Block
        );
        assert_eq!(page(PageChoice::Auto, LayoutKind::ID), PageKind::Targets);
        assert_eq!(
            page(PageChoice::Auto, LayoutKind::Replicated),
            PageKind::Replicas
        );
        assert_eq!(page(PageChoice::Block, LayoutKind::ID), PageKind::Block);
        assert_eq!(
            page(PageChoice::Targets, LayoutKind::SHUFFLED),
            PageKind::Targets
        );
        assert!(choose_page(PageChoice::Replicas, LayoutKind::ID).is_err());
    }
}

/// Shards of a sharded graph build that hold fewer points than this cost
/// measurable recall against a graph built at once (the build warns).
/// Measured on 20,000 × 64 vectors, R 64, recall@10 at L 100: Gaussian
/// noise lost 0.3 points in shards of 9,600 points, 1 in 4,000, 2.5 in
/// 2,300 and 7 in 560 (0.991 at once); 32 Gaussian clusters lost nothing
/// down to 960 points, then 13 in 760, 21 in 360 and 57 in 19.
pub const SMALL_SHARD_POINTS: usize = 5_000;

/// What the build memory budget allows for the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphBudget {
    /// Shards the graph is built in (1: at once).
    pub shards: usize,
    /// Why.
    pub why: String,
    /// Set when the shards are small enough to cost recall.
    pub warning: Option<String>,
}

/// The graph build of `n × dim` elements of `esz` bytes at degree `r` on
/// `threads` threads within the build memory budget `budget` (the PQ codes,
/// `n × pq_bytes`, stay resident through the graph stage): at once, in
/// shards, or an error stating the least budget that holds the build.
#[allow(clippy::too_many_arguments)]
pub fn graph_build(
    n: usize,
    dim: usize,
    esz: usize,
    r: usize,
    pq_bytes: usize,
    threads: usize,
    budget: Option<u64>,
) -> Result<GraphBudget> {
    let Some(budget) = budget else {
        return Ok(GraphBudget {
            shards: 1,
            why: "at once: no build_memory_budget".into(),
            warning: None,
        });
    };
    let codes = n as u64 * pq_bytes as u64;
    let graph = budget.saturating_sub(codes);
    let one = estimate_build_bytes_on(n, dim, esz, r, threads) + codes;
    match plan_graph_build(n, dim, esz, r, graph, threads) {
        Ok(GraphBuild::OneShot) => Ok(GraphBudget {
            shards: 1,
            why: format!(
                "at once: build_memory_budget={budget} bytes holds a one-shot build ({one} bytes \
                 with the PQ codes)"
            ),
            warning: None,
        }),
        Ok(GraphBuild::Sharded(p)) => Ok(GraphBudget {
            shards: p.shards,
            why: format!(
                "sharded: a one-shot build needs {one} bytes, more than \
                 build_memory_budget={budget} bytes; the fewest shards that fit, each of at \
                 most {} points",
                p.shard_capacity
            ),
            warning: sharding_warning(n, dim, esz, r, pq_bytes, threads, budget, p.shards),
        }),
        Err(need) => Err(Error::arg(format!(
            "build_memory_budget={budget} bytes is too small for {n} vectors of dimension {dim} \
             at R={r} on {threads} threads: the build needs at least {} bytes ({codes} for the \
             PQ codes, resident while the graph is built, and {need} for the graph, built in \
             shards); a one-shot build needs {one}; raise build_memory_budget",
            need + codes
        ))),
    }
}

/// A warning when a graph built in `shards` shards within `budget` has
/// shards small enough to cost recall, with the budgets that avoid it.
#[allow(clippy::too_many_arguments)]
pub fn sharding_warning(
    n: usize,
    dim: usize,
    esz: usize,
    r: usize,
    pq_bytes: usize,
    threads: usize,
    budget: u64,
    shards: usize,
) -> Option<String> {
    if shards < 2 {
        return None;
    }
    let cap = shard_capacity(n, shards);
    if cap >= SMALL_SHARD_POINTS.min(n) {
        return None;
    }
    let codes = n as u64 * pq_bytes as u64;
    let one = estimate_build_bytes_on(n, dim, esz, r, threads) + codes;
    // The least budget whose shards hold SMALL_SHARD_POINTS points (more
    // budget, fewer and larger shards).
    let big_enough = |b: u64| match plan_graph_build(n, dim, esz, r, b - codes, threads) {
        Ok(GraphBuild::OneShot) => true,
        Ok(GraphBuild::Sharded(p)) => p.shard_capacity >= SMALL_SHARD_POINTS,
        Err(_) => false,
    };
    let (mut lo, mut hi) = (budget.max(codes), one.max(budget));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if big_enough(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(format!(
        "the graph is built in {shards} shards of at most {cap} points each \
         (build_memory_budget={budget} bytes): shards under {SMALL_SHARD_POINTS} points lose \
         recall against a graph built at once; build_memory_budget={hi} bytes gives shards of \
         {SMALL_SHARD_POINTS} points or more, {one} bytes builds the graph at once"
    ))
}
