//! The memory model: what each resident structure of an open index costs,
//! computed the way the structure itself counts its bytes, and the split of
//! one memory budget among them.
//!
//! Order of the split: the fixed-size structures first (PQ codebook,
//! external ids, layout map, entry structure, the workers' scratch), then
//! the PQ codes (at build, DiskANN's rule on what the fixed structures
//! leave), then the cache gets the rest.

use super::Decision;
use crate::cache::NodeCache;
use crate::format::page::PageGeometry;
use crate::format::{LayoutKind, Placement};
use crate::util::huge::{HUGE_MIN_BYTES, HUGE_PAGE};
use crate::{Error, Result};
use serde::Serialize;

/// Bytes of the PQ codes of `n` vectors of `m` bytes, as held (in whole
/// huge pages when the table is large; see `util::huge`).
pub fn pq_codes_bytes(n: usize, m: usize) -> u64 {
    pq_codes_held(n, m, false)
}

/// [`pq_codes_bytes`] for a table opened to grow (an index updated in
/// place): such a table always lives in a mapping advised for huge pages
/// (`HugeBytes::growable`), so it is held in whole huge pages whatever its
/// size.
pub fn pq_codes_held(n: usize, m: usize, growable: bool) -> u64 {
    let len = n as u64 * m as u64;
    if len < HUGE_MIN_BYTES as u64 && !growable {
        len
    } else {
        len.div_ceil(HUGE_PAGE as u64) * HUGE_PAGE as u64
    }
}

/// Bytes of a PQ codebook over `dim` dimensions in `m` chunks (centroids,
/// the centre and the chunk offsets).
pub fn codebook_bytes(dim: usize, m: usize) -> u64 {
    let words = (m + 1) + crate::quant::pq::PQ_CENTROIDS * dim + dim;
    (std::mem::size_of::<crate::quant::pq::PqCodebook>() + 4 * words) as u64
}

/// Bytes of the external ids of `n` nodes.
pub fn ids_bytes(n: usize) -> u64 {
    8 * n as u64
}

/// Bytes of a layout's maps (a shuffled layout or a page graph holds node →
/// position and position → node; the ID layout none).
pub fn layout_map_bytes(layout: LayoutKind, n: usize, geo: &PageGeometry) -> u64 {
    match layout.placement() {
        Placement::Id => 0,
        Placement::Shuffled | Placement::PageGraph => {
            4 * (n as u64 + geo.n_blocks * geo.records_per_block as u64)
        }
    }
}

/// Bytes a navigation graph holds, from its section size (the section is
/// its resident arrays after a 32-byte header).
pub fn nav_bytes_from_section(section: u64) -> u64 {
    section.saturating_sub(32)
}

/// Section size of a navigation graph of `count` nodes of degree bound `r`.
pub fn nav_section_bytes(count: usize, r: usize, dim: usize, esz: usize) -> u64 {
    32 + count as u64 * (4 * (2 + r as u64) + (dim * esz) as u64)
}

/// Bytes centroid entries hold, from their section size (24-byte header).
pub fn centroid_bytes_from_section(section: u64) -> u64 {
    section.saturating_sub(24)
}

/// Section size of `count` centroid entries.
pub fn centroid_section_bytes(count: usize, dim: usize, esz: usize) -> u64 {
    24 + count as u64 * (4 + (dim * esz) as u64)
}

/// Bytes of `count` sampled entry points.
pub fn sampled_bytes(count: usize, dim: usize, esz: usize) -> u64 {
    count as u64 * (4 + (dim * esz) as u64)
}

/// hashbrown's table for `entries` items of `slot` bytes: buckets (a power
/// of two, 8/7 of the items) times the slot plus one control byte.
fn table_bytes(entries: usize, slot: usize) -> u64 {
    if entries == 0 {
        return 0;
    }
    let buckets = (entries.saturating_mul(8) / 7 + 1)
        .next_power_of_two()
        .max(4);
    (buckets * (slot + 1) + 16) as u64
}

/// What one query's scratch depends on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryShape {
    /// Nodes in the index.
    pub n: usize,
    /// Vector dimension and element size.
    pub dim: usize,
    pub esz: usize,
    /// Maximum degree.
    pub r: usize,
    /// PQ bytes (the lookup table is `m × 256` floats).
    pub pq_m: usize,
    pub block_size: usize,
    pub records_per_block: usize,
    /// The largest list the query may reach (L, or a range search's max L).
    pub l: usize,
    /// Reads in flight per query.
    pub width: usize,
    /// Block search's σ (it expands co-located records too).
    pub sigma: Option<f32>,
    /// Lists a replicated record packs (0: none; the query keeps some).
    pub packed: usize,
    /// Two-stage search: the candidates the refine stage reads, all in
    /// flight at once (0: no refine stage). Nodes expanded from memory wait
    /// for it in a set of their own.
    pub refine: usize,
    /// FastScan groups of the neighbour codes in the records (0: none; the
    /// query keeps its tables, the sums and the estimates).
    pub code_groups: usize,
}

/// Bytes a query's in-record code scorer holds for codes of `code_groups`
/// FastScan groups, degree `r` and dimension `dim`: the tables (16 bytes a
/// group), two scalars, the sums of the padded slots, the estimates, and
/// the transformed query (with its centred copy while it is transformed).
pub fn code_state_bytes(code_groups: usize, r: usize, dim: usize) -> u64 {
    if code_groups == 0 {
        return 0;
    }
    let groups = code_groups as u64;
    let slots = crate::quant::fastscan::padded_count(r) as u64;
    16 * groups + 16 + 4 * slots + 4 * r as u64 + 8 * dim as u64 + 64
}

/// Bytes the transform of a coded layout holds: the PCA (mean, variances,
/// basis) and the rotation, merged at open into one `d × d` matrix and a
/// mean.
pub fn coded_quantizer_bytes(dim: usize, principal: usize) -> u64 {
    if principal == 0 {
        return 0;
    }
    let d = dim as u64;
    4 * (d * d + 2 * d) + 4 * principal as u64 + 256
}

/// Bytes of one query slot's scratch at its largest: the scorer's table,
/// the candidate list, the visited set (bounded by `(2L + W)·R` scored
/// neighbours, more with block search, and by `n`), the exact results,
/// the read bookkeeping and its page buffers.
pub fn query_bytes(s: &QueryShape) -> u64 {
    let table = (s.pq_m * crate::quant::pq::PQ_CENTROIDS * 4) as u64;
    let cand = (s.l + 1) as u64 * 12;
    let expand_factor = match s.sigma {
        Some(sig) => 1.0 + sig as f64 * s.records_per_block.saturating_sub(1) as f64,
        None => 1.0,
    };
    let hops = ((2 * s.l + s.width) as f64 * expand_factor).ceil() as usize;
    let visited = hops.saturating_mul(s.r).min(s.n);
    let visited_bytes = table_bytes(visited, 4);
    // (Vectors grow by doubling: the exact results' may reach the next
    // power of two.)
    let exact = (hops.min(s.n).next_power_of_two() as u64) * 8;
    // Reads, targets, free read ids, the page's targets; the expansion's
    // scratch and a cached list unpacked.
    let in_flight = s.width.max(s.refine) as u64;
    let reads = in_flight * (16 + 12 + 2 + 4) + 8 * s.r as u64;
    // A query's W reads (the refine stage's, when more), and one more while
    // an arrived page is processed (its buffer goes back after the next
    // read is issued).
    let buffers = (in_flight + 1) * s.block_size as u64;
    let query = (s.dim * (4 + s.esz)) as u64;
    // Replicated pages: the lists a query keeps (bounded per list entry)
    // and their index; the beam's in-memory frontier.
    // (The lists' buffer grows by doubling too.)
    let loaded = if s.packed > 0 {
        let lists = crate::search::MAX_LOADED_PER_L * s.l;
        (lists * (s.r + 1)).next_power_of_two() as u64 * 4 + table_bytes(lists, 8)
    } else {
        0
    };
    let unrefined = if s.refine > 0 {
        table_bytes(hops.min(s.n), 4)
    } else {
        0
    };
    let memory = s.width as u64 * 4;
    let codes = code_state_bytes(s.code_groups, s.r, s.dim);
    table
        + codes
        + cand
        + visited_bytes
        + exact
        + reads
        + buffers
        + query
        + loaded
        + unrefined
        + memory
        + 2048
}

/// Adjacency lists of mean degree `degree` an adjacency cache holds in
/// `share` bytes (its node index costs 4 bytes a node once any list fits;
/// a list, its bit-packed ids and a 4-byte offset).
pub fn adjacency_lists_for(share: u64, n: usize, degree: f64) -> u64 {
    let index = crate::cache::AdjacencyCache::index_bytes(n);
    if share <= index {
        return 0;
    }
    let bits = crate::util::bitpack::bits_for(n) as f64;
    let per_list = 4.0 + (degree.max(0.0) * bits / 8.0).ceil();
    (((share - index) as f64 / per_list) as u64).min(n as u64)
}

/// The largest PQ size, at most `cap`, whose codes leave an adjacency cache
/// room for every node's list at degree `r`, in the memory `plan` gives the
/// codes (planned at `cap`) and the cache together; `None` when not even
/// one-byte codes do.
pub fn pq_bytes_leaving_every_list(
    plan: &MemoryPlan,
    n: usize,
    r: usize,
    cap: usize,
) -> Option<usize> {
    let together = plan.pq_codes + plan.cache;
    let lists = crate::cache::AdjacencyCache::index_bytes(n)
        .saturating_add((n as u64).saturating_mul(crate::cache::AdjacencyCache::list_bytes(n, r)));
    let room = together.checked_sub(lists)?;
    (1..=cap).rev().find(|&m| pq_codes_bytes(n, m) <= room)
}

/// Bytes of an I/O engine for `depth` reads in flight.
pub fn engine_bytes(depth: usize) -> u64 {
    crate::io::IoEngine::bytes_for_depth(depth)
}

/// Bytes of one worker: `qif` query slots, its engine, and its thread's
/// stack and allocator slack.
pub fn worker_bytes(s: &QueryShape, qif: usize) -> u64 {
    let depth = (qif * s.width).clamp(
        crate::search::MAX_BEAM_WIDTH,
        crate::search::executor::MAX_ENGINE_DEPTH,
    );
    qif as u64 * query_bytes(s)
        + engine_bytes(depth.next_power_of_two())
        + (depth.next_power_of_two() * std::mem::size_of::<crate::io::Completion>()) as u64
        + crate::search::pool::WORKER_THREAD_BYTES as u64
}

/// The split of one memory budget, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryPlan {
    /// The budget.
    pub budget: u64,
    pub pq_codes: u64,
    pub pq_codebook: u64,
    /// External ids.
    pub ids: u64,
    /// A shuffled layout's maps.
    pub layout_map: u64,
    /// The entry structure in use (navigation graph, centroid or sampled
    /// entries).
    pub entry: u64,
    /// A coded layout's transform (PCA and rotation; 0 otherwise).
    pub quantizer: u64,
    /// What the search workers may hold (buffers, query slots, rings).
    pub worker_scratch: u64,
    /// The cache's share: what the budget leaves.
    pub cache: u64,
    /// Nodes the cache holds in that share (an adjacency cache: lists).
    pub cache_nodes: u64,
    /// What the cache holds: `bfs` or `in_degree` (whole records) or
    /// `adjacency`.
    pub cache_policy: &'static str,
    /// The smallest budget these structures fit in (no cache).
    pub minimum: u64,
    /// The largest L a search of one query per worker (the default W and
    /// threads) runs with in the workers' share, without borrowing from
    /// the cache (0: not even L = 10).
    #[serde(rename = "search_L_covered")]
    pub search_l_covered: usize,
}

impl MemoryPlan {
    /// Everything but the cache.
    pub fn fixed(&self) -> u64 {
        self.pq_codes
            + self.pq_codebook
            + self.ids
            + self.layout_map
            + self.entry
            + self.quantizer
            + self.worker_scratch
    }
}

/// The structures whose sizes depend on neither the budget nor the PQ
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FixedCosts {
    pub ids: u64,
    pub layout_map: u64,
    pub entry: u64,
    /// A coded layout's transform.
    pub quantizer: u64,
}

impl FixedCosts {
    /// Their sum (saturating: the sizes come from a manifest, and a sum
    /// past `u64::MAX` is as far beyond any budget).
    pub fn total(&self) -> u64 {
        self.ids
            .saturating_add(self.layout_map)
            .saturating_add(self.entry)
            .saturating_add(self.quantizer)
    }
}

/// The most nodes an in-degree cache holds, as a share of the index
/// (AlayaLaser: 0.15·N).
pub const IN_DEGREE_CACHE_SHARE: f64 = 0.15;

/// The share of the budget the search workers may take for interleaving
/// several queries (one query per worker is always reserved).
pub const SCRATCH_SHARE: f64 = 0.10;

/// Bytes one worker needs with `qif` queries in flight and `m` PQ bytes.
pub type WorkerCost<'a> = &'a dyn Fn(usize, usize) -> u64;

/// Queries in flight per worker the budget reserves scratch for: the most
/// (up to [`preset::AUTO_QUERIES_IN_FLIGHT`]) whose scratch on `threads`
/// workers stays within [`SCRATCH_SHARE`] of `budget` and within
/// `available`; at least one.
fn reserved_qif(
    budget: u64,
    available: u64,
    threads: usize,
    m: usize,
    worker: WorkerCost<'_>,
) -> usize {
    let cap = ((budget as f64 * SCRATCH_SHARE) as u64).min(available);
    (1..=super::preset::AUTO_QUERIES_IN_FLIGHT)
        .rev()
        .find(|&q| threads as u64 * worker(q, m) <= cap)
        .unwrap_or(1)
}

/// The smallest fraction of `raw` bytes that is at least `bytes` (rounded
/// up to 3 decimals), for messages.
pub fn fraction_at_least(bytes: u64, raw: u64) -> f64 {
    if raw == 0 {
        return 1.0;
    }
    ((bytes as f64 / raw as f64) * 1000.0).ceil() / 1000.0
}

/// The parts of a minimum, for messages.
struct Minimum {
    total: u64,
    codes: u64,
    codebook: u64,
    scratch: u64,
    threads: usize,
}

fn minimum_message(what: &str, budget: u64, raw: u64, fixed: &FixedCosts, min: &Minimum) -> String {
    let minimum = min.total;
    format!(
        "memory_budget={budget} bytes is below what {what} needs: at least {minimum} bytes \
         (≈ {:.3} of the raw vectors' {raw} bytes) for PQ codes {}, codebook {}, ids {}, \
         layout map {}, entry structure {}, transform {}, search workers {} ({} threads, one \
         query each); \
         give memory_budget of at least {minimum} (or a fraction of at least {:.3})",
        minimum as f64 / raw.max(1) as f64,
        min.codes,
        min.codebook,
        fixed.ids,
        fixed.layout_map,
        fixed.entry,
        fixed.quantizer,
        min.scratch,
        min.threads,
        fraction_at_least(minimum, raw),
    )
}

/// Build-time split. The workers' scratch is reserved first (see
/// [`reserved_qif`]), then the PQ bytes come from DiskANN's rule on what
/// the fixed structures and the workers leave (or are `pq_bytes` when
/// given), and the cache gets the rest. `budget: None` takes
/// `default_budget` raised to the minimum.
#[allow(clippy::too_many_arguments)]
pub fn split_at_build(
    what: &str,
    n: usize,
    dim: usize,
    raw: u64,
    fixed: &FixedCosts,
    threads: usize,
    worker: WorkerCost<'_>,
    pq_bytes: Option<usize>,
    budget: Option<u64>,
    default_budget: u64,
    pq_share: f64,
    reserve: f64,
    growable: bool,
    geo: &PageGeometry,
    decisions: &mut Vec<Decision>,
) -> Result<(usize, MemoryPlan)> {
    let t = threads as u64;
    let codes = |m: usize| pq_codes_held(n, m, growable);
    let need =
        |m: usize, q: usize| fixed.total() + codebook_bytes(dim, m) + codes(m) + t * worker(q, m);
    let m_min = pq_bytes.unwrap_or(1);
    let min = Minimum {
        total: need(m_min, 1),
        codes: codes(m_min),
        codebook: codebook_bytes(dim, m_min),
        scratch: t * worker(1, m_min),
        threads,
    };
    // No budget given: the PQ codes take what DiskANN's default gives them
    // (its rule on 1/8 of the raw vectors), and the budget is what that
    // index needs with room for four queries per worker.
    let auto_m = budget.is_none().then(|| {
        pq_bytes.unwrap_or_else(|| super::rules::pq_bytes_for_budget(n, dim, default_budget))
    });
    let (budget, why) = match (budget, auto_m) {
        (Some(b), _) => (b, "asked for".to_string()),
        (None, m) => {
            let m = m.unwrap_or(m_min);
            let b = need(m, super::preset::AUTO_QUERIES_IN_FLIGHT).max(min.total);
            (
                b,
                format!(
                    "auto: PQ codes of {m} bytes (DiskANN's rule on 1/8 of the raw vectors, \
                     {default_budget} bytes) plus what the other structures and four queries per \
                     worker need"
                ),
            )
        }
    };
    decisions.push(Decision::new("memory_budget", budget, why));
    if budget < min.total {
        return Err(Error::arg(minimum_message(what, budget, raw, fixed, &min)));
    }
    // The update reserve (`rules::update_reserve`): a share of what the
    // budget leaves beyond its minimum, kept from the codes and the workers'
    // interleaving; at open it is the cache's until the update delta takes it.
    let avail = budget - ((budget - min.total) as f64 * reserve.clamp(0.0, 1.0)) as u64;
    // The workers first: interleaving within its share of the budget.
    let q = reserved_qif(
        avail,
        avail - need(m_min, 1) + t * worker(1, m_min),
        threads,
        m_min,
        worker,
    );
    let m = match (pq_bytes, auto_m) {
        (Some(m), _) => {
            decisions.push(Decision::new("pq_bytes", m, "asked for"));
            m
        }
        (None, Some(m)) => {
            decisions.push(Decision::new(
                "pq_bytes",
                m,
                "DiskANN's rule floor(budget / n) on its default budget, 1/8 of the raw vectors",
            ));
            m
        }
        (None, None) => {
            let left = avail.saturating_sub(need(1, q) - codes(1));
            let left = (left as f64 * pq_share.clamp(0.0, 1.0)) as u64;
            let mut m = super::rules::pq_bytes_for_budget(n, dim, left);
            // The codebook grows by 4 bytes a chunk, the workers' tables by
            // 1 KiB, and large code tables round to huge pages: step down
            // until everything fits.
            while m > 1 && need(m, q) > avail {
                m -= 1;
            }
            decisions.push(Decision::new(
                "pq_bytes",
                m,
                format!(
                    "DiskANN's rule floor(left / n), clamped to [1, min(dim, 512)], on the \
                     {left} bytes the fixed structures and the workers leave of the budget"
                ),
            ));
            m
        }
    };
    // With the PQ bytes known (the workers' tables grow with them), the
    // interleaving the budget holds within the workers' share.
    let q = if auto_m.is_some() {
        super::preset::AUTO_QUERIES_IN_FLIGHT
    } else {
        let rest = avail.saturating_sub(need(m, 1) - t * worker(1, m));
        reserved_qif(avail, rest, threads, m, worker)
    };
    decisions.push(Decision::new(
        "worker_scratch",
        t * worker(q, m),
        format!(
            "{threads} workers × {q} queries in flight (interleaving may take up to {:.0}% of \
             the budget; one query per worker always fits)",
            SCRATCH_SHARE * 100.0
        ),
    ));
    let mut plan = MemoryPlan {
        budget,
        pq_codes: codes(m),
        pq_codebook: codebook_bytes(dim, m),
        ids: fixed.ids,
        layout_map: fixed.layout_map,
        entry: fixed.entry,
        quantizer: fixed.quantizer,
        worker_scratch: t * worker(q, m),
        cache: 0,
        cache_nodes: 0,
        cache_policy: "bfs",
        minimum: min.total,
        search_l_covered: 0,
    };
    plan.cache = budget.saturating_sub(plan.fixed());
    plan.cache_nodes = NodeCache::capacity_for(geo, plan.cache).min(n) as u64;
    Ok((m, plan))
}

/// Open-time split of `budget` for an index whose fixed structures cost
/// `fixed`, with `m` PQ bytes and `codebook` bytes of codebook. Threads:
/// `threads` when given, else the most up to `cores` whose workers fit
/// (one query each). The workers' reserve is [`reserved_qif`]'s; the cache
/// gets the rest, or exactly `cache_nodes` when asked (if they fit).
#[allow(clippy::too_many_arguments)]
pub fn split_at_open(
    what: &str,
    budget: u64,
    raw: u64,
    n: usize,
    m: usize,
    codebook: u64,
    fixed: &FixedCosts,
    threads: Option<usize>,
    cores: usize,
    worker: WorkerCost<'_>,
    cache_nodes: Option<usize>,
    grow: bool,
    growable_codes: bool,
    adjacency: Option<f64>,
    in_degree: bool,
    geo: &PageGeometry,
    decisions: &mut Vec<Decision>,
) -> Result<(usize, MemoryPlan)> {
    let codes = pq_codes_held(n, m, growable_codes);
    // Saturating: what the manifest's sizes sum to may exceed any budget.
    let base = fixed.total().saturating_add(codebook).saturating_add(codes);
    let mut budget = budget;
    let available = budget.saturating_sub(base);
    let threads = match threads {
        Some(t) => {
            decisions.push(Decision::new("threads", t, "asked for"));
            t
        }
        None => {
            let fit = (available / worker(1, m).max(1)).min(cores as u64).max(1) as usize;
            decisions.push(Decision::new(
                "threads",
                fit,
                if fit < cores {
                    format!("the workers of {fit} of the {cores} cores fit the budget")
                } else {
                    "default: the cores available".to_string()
                },
            ));
            fit
        }
    };
    let t = threads as u64;
    let one_each = t.saturating_mul(worker(1, m));
    let min = Minimum {
        total: base.saturating_add(one_each),
        codes,
        codebook,
        scratch: one_each,
        threads,
    };
    // A saturated sum is beyond any budget, `u64::MAX` included.
    if budget < min.total || min.total == u64::MAX {
        return Err(Error::arg(minimum_message(what, budget, raw, fixed, &min)));
    }
    // A budget nearline sized itself holds four queries per worker (what
    // its build planned); a given one, what its workers' share holds.
    let q = if grow {
        super::preset::AUTO_QUERIES_IN_FLIGHT
    } else {
        reserved_qif(budget, available, threads, m, worker)
    };
    let scratch = t.saturating_mul(worker(q, m));
    if grow && scratch > available {
        budget = budget.saturating_add(scratch - available);
    }
    let available = available.max(scratch);
    decisions.push(Decision::new(
        "worker_scratch",
        scratch,
        format!(
            "{threads} workers × {q} queries in flight (interleaving may take up to {:.0}% of \
             the budget; one query per worker always fits)",
            SCRATCH_SHARE * 100.0
        ),
    ));
    let mut share = available - scratch;
    if let Some(degree) = adjacency {
        // An adjacency cache takes the whole share (lists in priority
        // order while they fit, then vectors), `cache_nodes` lists at most.
        let fit = adjacency_lists_for(share, n, degree);
        let lists = cache_nodes.map_or(fit, |c| fit.min(c as u64));
        decisions.push(Decision::new(
            "cache_nodes",
            lists,
            match cache_nodes {
                Some(c) if (c as u64) < fit => "asked for (adjacency lists)".to_string(),
                _ => format!(
                    "adjacency lists (mean degree {degree:.1}) the {share} bytes left by everything \
                     else hold, breadth-first from the entry points; vectors too if all fit"
                ),
            },
        ));
        return Ok((
            threads,
            MemoryPlan {
                budget,
                pq_codes: codes,
                pq_codebook: codebook,
                ids: fixed.ids,
                layout_map: fixed.layout_map,
                entry: fixed.entry,
                quantizer: fixed.quantizer,
                worker_scratch: scratch,
                cache: share,
                cache_nodes: lists,
                cache_policy: "adjacency",
                minimum: min.total,
                search_l_covered: 0,
            },
        ));
    }
    let nodes = match cache_nodes {
        Some(c) => {
            let need = NodeCache::bytes_for(geo, c);
            if need > share && grow {
                // A budget nearline sized itself grows to hold the cache asked for.
                budget += need - share;
                share = need;
                decisions.push(Decision::new(
                    "memory_budget",
                    budget,
                    format!("auto: raised to hold cache_nodes={c}"),
                ));
            }
            if need > share {
                return Err(Error::arg(format!(
                    "cache_nodes={c} needs {need} bytes, but memory_budget={budget} leaves the \
                     cache {share} bytes after the codes, the fixed structures and the workers \
                     ({} bytes); give memory_budget of at least {} or fewer cache_nodes",
                    budget - share,
                    budget - share + need
                )));
            }
            decisions.push(Decision::new("cache_nodes", c, "asked for"));
            c
        }
        None if in_degree => {
            // AlayaLaser: min(0.8·budget / record, 0.15·N) rows; whatever
            // the share holds beyond the cap stays unused.
            let fit = NodeCache::capacity_for(geo, share).min(n);
            let cap = (IN_DEGREE_CACHE_SHARE * n as f64).ceil() as usize;
            let c = fit.min(cap);
            decisions.push(Decision::new(
                "cache_nodes",
                c,
                format!(
                    "AlayaLaser: the highest in-degree records the {share} bytes left by \
                     everything else hold ({fit}), at most {:.0}% of the nodes ({cap})",
                    IN_DEGREE_CACHE_SHARE * 100.0
                ),
            ));
            c
        }
        None => {
            let c = NodeCache::capacity_for(geo, share).min(n);
            decisions.push(Decision::new(
                "cache_nodes",
                c,
                format!(
                    "what the {share} bytes left by everything else hold (BFS from the medoid)"
                ),
            ));
            c
        }
    };
    Ok((
        threads,
        MemoryPlan {
            budget,
            pq_codes: codes,
            pq_codebook: codebook,
            ids: fixed.ids,
            layout_map: fixed.layout_map,
            entry: fixed.entry,
            quantizer: fixed.quantizer,
            worker_scratch: scratch,
            cache: NodeCache::bytes_for(geo, nodes),
            cache_nodes: nodes as u64,
            cache_policy: if in_degree { "in_degree" } else { "bfs" },
            minimum: min.total,
            search_l_covered: 0,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_to_huge_pages_only_when_large() {
        assert_eq!(pq_codes_bytes(1000, 8), 8000);
        // A table opened to grow is mapped, so held in huge pages, whatever its size.
        assert_eq!(pq_codes_held(1000, 8, true), HUGE_PAGE as u64);
        assert_eq!(pq_codes_held(30_000, 229, true), 4 * HUGE_PAGE as u64);
        assert_eq!(pq_codes_held(0, 8, true), 0);
        let big = pq_codes_bytes(1_000_000, 32);
        assert_eq!(big % HUGE_PAGE as u64, 0);
        assert!(big >= 32_000_000 && big < 32_000_000 + HUGE_PAGE as u64);
    }

    #[test]
    fn tables_grow_in_powers_of_two() {
        assert_eq!(table_bytes(0, 4), 0);
        assert_eq!(table_bytes(7, 4), 16 * 5 + 16);
        assert_eq!(table_bytes(100, 4), 128 * 5 + 16);
    }

    #[test]
    fn build_split_applies_diskann_rule_to_the_remainder() {
        let geo = PageGeometry::new(4096, 512, 64, 100_000).unwrap();
        let fixed = FixedCosts {
            ids: 0,
            layout_map: 800_000,
            entry: 300_000,
            quantizer: 0,
        };
        let worker = |q: usize, m: usize| (q * (50_000 + 1024 * m)) as u64;
        let mut d = Vec::new();
        let raw = 100_000 * 512;
        let split = |budget: Option<u64>, d: &mut Vec<Decision>| {
            split_at_build(
                "test", 100_000, 128, raw, &fixed, 2, &worker, None, budget, 10, 1.0, 0.0, false,
                &geo, d,
            )
        };
        let (m, plan) = split(Some(6_400_000), &mut d).unwrap();
        assert!(plan.fixed() + plan.cache <= 6_400_000, "{plan:?}");
        assert!(plan.fixed() <= plan.budget);
        // 6.4 MB less 1.1 MB of fixed structures, the codebook and the
        // workers leaves ~45 bytes a vector.
        assert!((40..=52).contains(&m), "{m}");
        // Interleaving takes at most a tenth of the budget.
        assert!(plan.worker_scratch <= 640_000, "{plan:?}");
        let e = split(Some(1_000_000), &mut d).unwrap_err().to_string();
        assert!(
            e.contains("at least") && e.contains(&plan.minimum.to_string()),
            "{e}"
        );
        // No budget: PQ codes by DiskANN's rule on its default (here 10
        // bytes: one byte a vector), the budget what that index needs with
        // four queries per worker, and no room left for a cache.
        let (m, p) = split(None, &mut d).unwrap();
        assert_eq!(m, 1);
        assert!(p.budget > p.minimum && p.fixed() == p.budget, "{p:?}");
    }

    /// A manifest's sizes can sum past `u64::MAX` (the sections' sizes
    /// are what it records): the split refuses them, whatever the budget.
    #[test]
    fn open_split_of_sizes_past_u64_is_an_error_not_an_overflow() {
        let geo = PageGeometry::new(4096, 512, 64, 100_000).unwrap();
        let worker = |q: usize, _m: usize| (q * 100_000) as u64;
        let mut d = Vec::new();
        for (fixed, codebook) in [
            (
                FixedCosts {
                    ids: u64::MAX / 2,
                    layout_map: u64::MAX / 2,
                    entry: u64::MAX / 2,
                    quantizer: 0,
                },
                1000,
            ),
            (FixedCosts::default(), u64::MAX),
        ] {
            for threads in [None, Some(1), Some(usize::MAX)] {
                let r = split_at_open(
                    "test",
                    u64::MAX,
                    1,
                    100_000,
                    16,
                    codebook,
                    &fixed,
                    threads,
                    8,
                    &worker,
                    None,
                    false,
                    false,
                    None,
                    false,
                    &geo,
                    &mut d,
                );
                assert!(r.is_err(), "{fixed:?} {codebook} {threads:?}");
            }
        }
    }

    #[test]
    fn open_split_fits_threads_and_cache_in_the_budget() {
        let geo = PageGeometry::new(4096, 512, 64, 100_000).unwrap();
        let fixed = FixedCosts::default();
        let worker = |q: usize, _m: usize| (q * 100_000) as u64;
        let mut d = Vec::new();
        let codes = pq_codes_bytes(100_000, 16);
        let open = |budget, threads, cache, d: &mut Vec<Decision>| {
            split_at_open(
                "test", budget, 1, 100_000, 16, 1000, &fixed, threads, 8, &worker, cache, false,
                false, None, false, &geo, d,
            )
        };
        // Room for eight one-query workers: all eight cores, a cache.
        let (t, p) = open(codes + 1000 + 2_000_000, None, None, &mut d).unwrap();
        assert_eq!(t, 8);
        assert!(
            p.fixed() + p.cache <= p.budget && p.cache_nodes > 0,
            "{p:?}"
        );
        // Room for three: three threads by default, an error when asked for eight.
        let (t, _) = open(codes + 1000 + 350_000, None, None, &mut d).unwrap();
        assert_eq!(t, 3);
        let e = open(codes + 1000 + 350_000, Some(8), None, &mut d).unwrap_err();
        assert!(e.to_string().contains("8 threads"), "{e}");
        // An explicit cache that does not fit is refused.
        let e = open(codes + 1000 + 350_000, Some(1), Some(100_000), &mut d).unwrap_err();
        assert!(e.to_string().contains("cache_nodes=100000"), "{e}");
    }
}
