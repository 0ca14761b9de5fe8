//! The planner's rules for a partition index (preset `spfresh`): the head
//! count the memory budget allows, the posting limit, and the refusal of
//! options that belong to graph indexes.

use super::options::BuildOptions;
use super::Decision;
use crate::distance::Metric;
use crate::elem::DType;
use crate::graph::dynamic::HEAD_R;
use crate::partition::id_map_bytes;
use crate::partition::posting::{entry_bytes, PAYLOAD};
use crate::partition::state::PartitionParams;
use crate::{Error, Result};

/// SPANN's share of vectors that become heads (without a budget).
pub const HEAD_RATIO: f64 = 0.1;
/// The fewest heads per vector a budget may leave (postings of ~100).
pub const MIN_HEAD_RATIO: f64 = 0.01;
/// Most postings a vector is replicated into (SPANN's 8).
pub const REPLICAS: usize = 8;
/// SPANN's closure ε (see [`crate::partition::build::select_postings`]).
pub const CLOSURE: f32 = 0.0;
/// The share of the posting limit a build fills postings to: a posting
/// filled to its limit splits at the first insert (on wordnet at 20%, 2,371
/// splits in the first 5 epochs of 1% and recall 1.1 points below a fresh
/// build's at the same nprobe, postings thinned from 63 to 52 entries).
pub const BUILD_FILL: f64 = 0.8;
/// The recall@10 a build calibrates the default `nprobe` for.
pub const RECALL_TARGET: f64 = 0.95;
/// SPFresh's merge threshold (live entries).
pub const MERGE_THRESHOLD: usize = 10;
/// Postings near a split whose vectors LIRE checks (SPFresh's ReassignK).
pub const REASSIGN_K: usize = 64;
/// Bytes of a search worker's reads in flight (the engine's depth of
/// runs of up to 32 blocks is counted by the index itself; this is the
/// planner's reserve per thread for its buffers and scratch).
pub const SCRATCH_PER_THREAD: u64 = 1 << 20;

/// Resident bytes of one head: vector, list, flags, posting map entry.
pub fn head_bytes(dim: usize, posting_blocks: usize) -> u64 {
    (dim * 4 + (HEAD_R + 1) * 4 + 1 + 8 + 48 + posting_blocks * 4) as u64
}

/// A partition build's parameters and why.
#[derive(Debug, Clone)]
pub struct PlannedPartition {
    pub params: PartitionParams,
    /// Resident bytes the index is expected to hold after the build.
    pub expected_bytes: u64,
    pub decisions: Vec<Decision>,
}

/// Plans a partition build of `n` vectors of `dim` dimensions.
pub fn plan(opts: &BuildOptions, n: usize, dim: usize, dtype: DType) -> Result<PlannedPartition> {
    let refuse = |what: &str| {
        Err(Error::arg(format!(
            "{what} applies to graph indexes; preset \"spfresh\" builds a partition index"
        )))
    };
    // A partition index updates in place (LIRE): the hint is checked and
    // needs no memory kept at build.
    super::check_write_ratio(opts.write_ratio)?;
    if opts.r.is_some() {
        return refuse("R");
    }
    if opts.build_l.is_some() {
        return refuse("build_L");
    }
    if opts.alpha.is_some() {
        return refuse("alpha");
    }
    if opts.passes.is_some() {
        return refuse("passes");
    }
    if opts.saturate.is_some() {
        return refuse("saturate");
    }
    if opts.pq_bytes.is_some() {
        return refuse("pq_bytes");
    }
    if opts.page_size.is_some() {
        return refuse("page_size");
    }
    if opts.nav_sample.is_some() {
        return refuse("nav_sample");
    }
    if opts.entry_clusters.is_some() {
        return refuse("entry_clusters");
    }
    if opts.layout.is_some() {
        return refuse("layout");
    }
    if opts.disk_budget.is_some() {
        return refuse("disk_budget");
    }
    if opts.adjacency.is_some() {
        return refuse("adjacency");
    }
    if let Some(name) = opts.codes.given().first() {
        return refuse(name);
    }
    if dtype != DType::F32 {
        return Err(Error::arg(format!(
            "a partition index (preset \"spfresh\") stores float32 vectors; the data is {} — \
             convert it to float32",
            dtype.name()
        )));
    }
    let po = &opts.partition;
    let mut d = Vec::new();
    let pick = |d: &mut Vec<Decision>, what: &'static str, given: bool, v: String, rule: &str| {
        d.push(Decision::new(
            what,
            v,
            if given { "asked for" } else { rule },
        ));
    };
    if let Some(r) = po.head_ratio {
        if !(r > 0.0 && r <= 0.5) {
            return Err(Error::arg(format!("head_ratio={r} must lie in (0, 0.5]")));
        }
    }
    let replicas = po.replicas.unwrap_or(REPLICAS);
    if !(1..=32).contains(&replicas) {
        return Err(Error::arg(format!(
            "replicas={replicas} must lie in 1..=32"
        )));
    }
    let rng_factor = po.rng_factor.unwrap_or(1.0);
    if !(rng_factor.is_finite() && rng_factor > 0.0) {
        return Err(Error::arg(format!(
            "rng_factor={rng_factor} must be a positive number"
        )));
    }
    let closure = po.closure.unwrap_or(CLOSURE);
    if !(closure.is_finite() && closure >= 0.0) {
        return Err(Error::arg(format!(
            "closure={closure} must be a finite number >= 0"
        )));
    }
    let recall_target = po.recall_target.unwrap_or(RECALL_TARGET);
    if !(recall_target.is_finite() && recall_target > 0.0 && recall_target < 1.0) {
        return Err(Error::arg(format!(
            "recall_target={recall_target} must lie strictly between 0 and 1"
        )));
    }
    let reassign_k = po.reassign_k.unwrap_or(REASSIGN_K);
    let lire = po.lire.unwrap_or(true);
    let raw = (n * dim * 4) as u64;
    let threads = opts.threads.unwrap_or(2).max(1) as u64;
    let ids = id_map_bytes(n);
    let reserve = threads * SCRATCH_PER_THREAD;
    let mut ratio = po.head_ratio.unwrap_or(HEAD_RATIO);
    let (budget, auto) = match opts.memory_budget {
        Some(b) => (b.resolve(raw), false),
        None => (0, true),
    };
    // Postings of the mean size span this many blocks.
    let blocks_at = |r: f64| {
        ((replicas.min(4) as f64 / r) * entry_bytes(dim) as f64 / PAYLOAD as f64).ceil() as usize
            + 1
    };
    // As many heads as the build makes at that ratio.
    let heads_at = |r: f64| crate::partition::build::max_heads(n, r) as u64;
    if !auto {
        let fixed = ids + reserve;
        let per_head = head_bytes(dim, blocks_at(ratio));
        let fits = budget.saturating_sub(fixed) / per_head;
        let want = heads_at(ratio);
        if fits < want {
            if po.head_ratio.is_some() {
                return Err(Error::arg(format!(
                    "memory_budget {budget} B holds {fits} heads; head_ratio {ratio} needs {want} \
                     ({per_head} B each besides {fixed} B of id maps and search buffers)"
                )));
            }
            // Fewer heads make longer postings (more block ids per head):
            // settle the count that fits with its own posting length.
            let mut fits = fits;
            for _ in 0..4 {
                let r = fits as f64 / n as f64;
                if r <= 0.0 {
                    break;
                }
                fits = fits.min(budget.saturating_sub(fixed) / head_bytes(dim, blocks_at(r)));
            }
            let r = fits as f64 / n as f64;
            if r < MIN_HEAD_RATIO {
                let need =
                    fixed + heads_at(MIN_HEAD_RATIO) * head_bytes(dim, blocks_at(MIN_HEAD_RATIO));
                return Err(Error::arg(format!(
                    "memory_budget {budget} B is too small for a partition index over {n} \
                     vectors: it needs at least {need} B (heads for 1% of the vectors, id maps, \
                     search buffers)"
                )));
            }
            ratio = r;
            d.push(Decision::new(
                "head_ratio",
                format!("{ratio:.4}"),
                format!("the most heads the budget holds ({fits})"),
            ));
        } else {
            pick(
                &mut d,
                "head_ratio",
                po.head_ratio.is_some(),
                ratio.to_string(),
                "SPANN's 10%",
            );
        }
    } else {
        pick(
            &mut d,
            "head_ratio",
            po.head_ratio.is_some(),
            ratio.to_string(),
            "SPANN's 10%",
        );
    }
    let target = (1.0 / ratio).round().max(1.0) as usize;
    // A built posting holds its cluster and the replicas the RNG rule sends
    // it (about 2.7 entries per vector, ~27 at 10 vectors per cluster, up
    // to the limit in dense regions). A split leaves halves of the limit,
    // so postings under updates hover between half the limit and the
    // limit. At 4 clusters' worth the bytes a query reads stayed flat on a
    // shifted 100k workload but postings got more numerous and thinner
    // than a fresh build's, and recall fell 5 points below epoch 0's: 8
    // clusters' worth. At least two blocks' worth of entries.
    let per_block = (PAYLOAD / entry_bytes(dim)).max(1);
    // The build fills postings to 8 clusters' worth; the limit leaves
    // inserts the rest of BUILD_FILL's room.
    let limit = po.posting_limit.unwrap_or_else(|| {
        ((8 * target).max(2 * per_block).max(32) as f64 / BUILD_FILL).ceil() as usize
    });
    // SPFresh merges postings under 10 entries of limits in the hundreds;
    // here the threshold scales with the limit (1/16 of it, at most 10).
    let merge = po
        .merge_threshold
        .unwrap_or((limit / 16).clamp(1, MERGE_THRESHOLD));
    if limit < 4 {
        return Err(Error::arg(format!(
            "posting_limit={limit} must be at least 4"
        )));
    }
    if merge >= limit {
        return Err(Error::arg(format!(
            "merge_threshold={merge} must be below posting_limit={limit}"
        )));
    }
    pick(
        &mut d,
        "replicas",
        po.replicas.is_some(),
        replicas.to_string(),
        "SPANN's 8",
    );
    pick(
        &mut d,
        "rng_factor",
        po.rng_factor.is_some(),
        format!("{rng_factor}"),
        "SPANN's RNG rule: a further replica only where no head already chosen is nearer \
         the candidate head than the vector is",
    );
    pick(
        &mut d,
        "closure",
        po.closure.is_some(),
        format!("{closure}"),
        "off: on wordnet closures of 0.05-0.2 kept ~5.8-5.9 replicas a vector (posting \
         limits cut the rest) and lowered recall at equal nprobe by 0.3-1.9 points",
    );
    pick(
        &mut d,
        "posting_limit",
        po.posting_limit.is_some(),
        limit.to_string(),
        "8 × the cluster size at build, over the build fill",
    );
    d.push(Decision::new(
        "build_fill",
        format!("{BUILD_FILL}"),
        format!(
            "the build fills a posting to {} entries (replicas beyond are cut), so inserts \
             find room before a split",
            ((limit as f64 * BUILD_FILL).floor() as usize).max(1)
        ),
    ));
    pick(
        &mut d,
        "merge_threshold",
        po.merge_threshold.is_some(),
        merge.to_string(),
        "SPFresh's 10",
    );
    pick(
        &mut d,
        "reassign_k",
        po.reassign_k.is_some(),
        reassign_k.to_string(),
        "SPFresh's 64",
    );
    pick(
        &mut d,
        "updates",
        po.lire.is_some(),
        if lire { "lire" } else { "append-only (SPANN+)" }.to_string(),
        "SPFresh's LIRE",
    );
    pick(
        &mut d,
        "recall_target",
        po.recall_target.is_some(),
        format!("{recall_target}"),
        "the build searches sample data vectors at growing nprobe and keeps the first whose \
         recall@10 reaches the target plus half of the rest (a data vector lies in its own \
         posting, so the sample's recall leans high); that nprobe is the search's default",
    );
    let expected = ids + reserve + heads_at(ratio) * head_bytes(dim, blocks_at(ratio));
    let budget = if auto { expected } else { budget };
    d.push(Decision::new(
        "memory_budget",
        budget,
        if auto {
            "what the heads, id maps and search buffers take (no budget given)".to_string()
        } else {
            "asked for".to_string()
        },
    ));
    if opts.metric == Metric::InnerProduct {
        d.push(Decision::new(
            "assignment",
            "l2",
            "postings are clusters in L2; inner-product scores rank the entries read",
        ));
    }
    Ok(PlannedPartition {
        params: PartitionParams {
            posting_limit: limit,
            build_fill: BUILD_FILL,
            merge_threshold: merge,
            replicas,
            rng_factor,
            closure,
            reassign_k,
            lire,
            head_ratio: ratio,
            memory_budget: budget,
            memory_budget_auto: auto,
            seed: opts.seed,
            recall_target: Some(recall_target),
            nprobe: None,
        },
        expected_bytes: expected,
        decisions: d,
    })
}

/// What an open of a partition index would hold, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PartitionOpenPlan {
    /// The budget the open keeps (given at open, else the build's; `None`:
    /// sized by nearline at build).
    pub budget: Option<u64>,
    /// Estimated resident bytes: heads (at the build's ratio of the live
    /// vectors), id maps, the search threads' I/O buffers.
    pub expected_bytes: u64,
    pub heads_bytes: u64,
    pub id_map_bytes: u64,
    pub io_bytes: u64,
    pub threads: usize,
    pub decisions: Vec<Decision>,
}

/// Plans an open of the partition index of manifest `m` (what `nearline
/// plan INDEX` shows; the open itself measures what it holds).
pub fn plan_open(
    m: &crate::partition::state::PartitionManifest,
    opts: &super::OpenOptions,
) -> Result<PartitionOpenPlan> {
    let graph_only = [
        (opts.cache_nodes.is_some(), "cache_nodes"),
        (opts.cache != super::CacheChoice::Auto, "cache"),
        (opts.entry_points != 0, "entry_points"),
        (opts.entry != super::EntryChoice::Auto, "entry"),
        (opts.nav_l.is_some(), "nav_L"),
        (opts.nav_seeds.is_some(), "nav_seeds"),
    ];
    if let Some((_, what)) = graph_only.iter().find(|x| x.0) {
        return Err(Error::arg(format!(
            "{what} applies to graph indexes; this is a partition index"
        )));
    }
    let mut d = Vec::new();
    let threads = opts.threads.filter(|&t| t > 0).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    d.push(Decision::new(
        "threads",
        threads,
        if opts.threads.is_some() {
            "asked for"
        } else {
            "the cores"
        },
    ));
    let p = &m.params;
    let per_block = (PAYLOAD / entry_bytes(m.dim)).max(1);
    let heads = crate::partition::build::max_heads(m.n.max(1), p.head_ratio) as u64;
    let blocks = (p.posting_limit / 2).div_ceil(per_block).max(1);
    let heads_bytes = heads * head_bytes(m.dim, blocks);
    let ids = id_map_bytes(m.n);
    let io = crate::partition::io_bytes(threads);
    let expected = heads_bytes + ids + io;
    let raw = (m.n * m.dim * 4) as u64;
    let budget = match opts.memory_budget {
        Some(b) => Some(b.resolve(raw)),
        None => (!p.memory_budget_auto).then_some(p.memory_budget),
    };
    d.push(Decision::new(
        "memory_budget",
        budget.map_or("none".to_string(), |b| b.to_string()),
        match (opts.memory_budget.is_some(), budget) {
            (true, _) => "asked for at open".to_string(),
            (false, Some(_)) => "the build's".to_string(),
            (false, None) => "none: nearline sized the index at build".to_string(),
        },
    ));
    if let Some(b) = budget {
        d.push(Decision::new(
            "fits",
            if expected <= b { "yes" } else { "probably not" },
            format!(
                "about {expected} B held open ({heads} heads at the build's ratio, id maps, {threads} \
                 threads' I/O buffers); the open measures it and refuses more than {b} B"
            ),
        ));
    }
    d.push(Decision::new(
        "mode",
        if opts.read_only {
            "read-only"
        } else {
            "writer"
        },
        if opts.read_only {
            "asked for: follows the writer's log and checkpoints, takes no updates"
        } else {
            "the one process that inserts and deletes (read_only=True to read beside it)"
        },
    ));
    Ok(PartitionOpenPlan {
        budget,
        expected_bytes: expected,
        heads_bytes,
        id_map_bytes: ids,
        io_bytes: io,
        threads,
        decisions: d,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::options::PartitionOptions;
    use crate::util::Budget;

    /// The planner's id-map figure covers what the index's hash map really
    /// takes (its buckets round up to a power of two).
    #[test]
    fn id_map_estimate_covers_the_hash_map() {
        for n in [0usize, 1, 5, 7, 8, 100, 1000, 114_895, 123_457, 1_000_000] {
            let m: std::collections::HashMap<u64, u32> =
                std::collections::HashMap::with_capacity(n);
            let held = n as u64 * 12 + m.capacity() as u64 * 17 * 8 / 7;
            let est = id_map_bytes(n);
            assert!(est >= held, "n={n}: estimate {est} < held {held}");
            assert!(
                est <= held + held / 4 + 256,
                "n={n}: estimate {est} far above {held}"
            );
        }
    }

    #[test]
    fn budget_sets_the_heads_and_refuses_too_little() {
        let o = BuildOptions::default();
        let p = plan(&o, 100_000, 128, DType::F32).unwrap();
        assert_eq!(p.params.head_ratio, HEAD_RATIO);
        assert!(p.params.memory_budget_auto);
        // Two thirds of the automatic budget: fewer heads, within it (the id
        // maps, 4.8 MB of 100k ids' 9.6 MB, do not shrink with the heads).
        let smaller = p.expected_bytes * 2 / 3;
        let mut o = BuildOptions {
            memory_budget: Some(Budget::Bytes(smaller)),
            ..Default::default()
        };
        let q = plan(&o, 100_000, 128, DType::F32).unwrap();
        assert!(q.params.head_ratio < HEAD_RATIO && q.params.head_ratio >= MIN_HEAD_RATIO);
        assert!(q.expected_bytes <= smaller);
        o.memory_budget = Some(Budget::Bytes(1000));
        let e = plan(&o, 100_000, 128, DType::F32).unwrap_err().to_string();
        assert!(e.contains("too small"), "{e}");
    }

    #[test]
    fn graph_options_and_other_dtypes_are_refused() {
        let o = BuildOptions {
            r: Some(32),
            ..Default::default()
        };
        assert!(plan(&o, 1000, 8, DType::F32)
            .unwrap_err()
            .to_string()
            .contains("R applies"));
        let e = plan(&BuildOptions::default(), 1000, 8, DType::U8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("float32"), "{e}");
        let o = BuildOptions {
            partition: PartitionOptions {
                replicas: Some(0),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(plan(&o, 1000, 8, DType::F32).is_err());
    }
}
