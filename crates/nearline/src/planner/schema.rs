//! The API's one description of itself: every option of build, open, search
//! and range search (name, type, default, stage, what it does), every
//! per-query statistic, the names each option accepts and the defaults the
//! planner uses. The Python keyword checks, docstrings and CLI flags, the
//! bench's variant keys and the server's JSON schema are generated from
//! [`schema_json`]; nothing else declares an option.

use super::preset::{self, defaults, PresetDefaults, PresetExecutor, DEFAULT_L};
use super::{partition, CacheChoice, EntryChoice, ExecutorChoice, PageChoice, PresetChoice};
use crate::format::{LayoutKind, Preset};
use crate::layout::shuffle::{ShuffleAlgo, ShuffleParams};
use crate::search::stats::STATS;
use serde_json::{json, Value};

/// Where an option is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `nearline.build` (and `nearline plan` of data).
    Build,
    /// `nearline.open`.
    Open,
    /// `Index.search`.
    Search,
    /// `Index.range_search`.
    Range,
}

impl Stage {
    /// Every stage, in the order the API is used.
    pub const ALL: &'static [Stage] = &[Stage::Build, Stage::Open, Stage::Search, Stage::Range];

    /// The call's name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Build => "build",
            Stage::Open => "open",
            Stage::Search => "search",
            Stage::Range => "range_search",
        }
    }
}

/// What an option's value is.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// An integer of at least `min`.
    Int { min: i64 },
    /// An integer from a vocabulary list (e.g. page sizes).
    IntChoice(&'static str),
    /// A finite number in `[min, max]` (`min_open`, `max_open`: that end
    /// excluded).
    Float {
        min: f64,
        max: Option<f64>,
        min_open: bool,
        max_open: bool,
    },
    /// True or false.
    Bool,
    /// A name from the vocabulary list `0`.
    Name(&'static str),
    /// One of these names.
    Choice(&'static [&'static str]),
    /// Bytes (an integer), a size string (`"512MB"`) or a fraction of the raw
    /// vector bytes (a float in (0, 1]).
    Budget,
    /// Bytes or a size string.
    Size,
    /// An integer in `1..=max`, or `"auto"`.
    IntOrAuto { max: i64 },
    /// A 1-D array of integer ids in `0..2^63`.
    Ids,
}

/// One option of one or more stages.
#[derive(Debug, Clone)]
pub struct OptionSpec {
    /// Its keyword name (the CLI flag is `--` + the name with `-` for `_`,
    /// unless `cli` says otherwise).
    pub name: &'static str,
    /// The calls that take it (with this meaning).
    pub stages: &'static [Stage],
    /// Its type.
    pub kind: Kind,
    /// The default in words (from the engine's constants and presets).
    pub default: String,
    /// What it does.
    pub doc: &'static str,
    /// The CLI flag when it is not derived from the name.
    pub cli: Option<&'static str>,
    /// The CLI's placeholder for the value.
    pub metavar: Option<&'static str>,
}

const BUILD: &[Stage] = &[Stage::Build];
const OPEN: &[Stage] = &[Stage::Open];
const SEARCH: &[Stage] = &[Stage::Search];
const RANGE: &[Stage] = &[Stage::Range];
const QUERY: &[Stage] = &[Stage::Search, Stage::Range];

fn opt(
    name: &'static str,
    stages: &'static [Stage],
    kind: Kind,
    default: String,
    doc: &'static str,
) -> OptionSpec {
    OptionSpec {
        name,
        stages,
        kind,
        default,
        doc,
        cli: None,
        metavar: None,
    }
}

fn int(min: i64) -> Kind {
    Kind::Int { min }
}

fn float(min: f64, max: Option<f64>) -> Kind {
    Kind::Float {
        min,
        max,
        min_open: false,
        max_open: false,
    }
}

/// A number in (0, 1].
fn fraction() -> Kind {
    Kind::Float {
        min: 0.0,
        max: Some(1.0),
        min_open: true,
        max_open: false,
    }
}

/// The graph presets' value of a default, in words: one value when they
/// agree, else each preset's.
fn by_preset(f: impl Fn(&PresetDefaults) -> String) -> String {
    let vals: Vec<(Preset, String)> = Preset::ALL
        .iter()
        .filter(|&&p| p != Preset::Spfresh)
        .map(|&p| (p, f(&defaults(p))))
        .collect();
    if vals.iter().all(|(_, v)| *v == vals[0].1) {
        format!("the preset's, {}", vals[0].1)
    } else {
        let each: Vec<String> = vals
            .iter()
            .map(|(p, v)| format!("{} {v}", p.name()))
            .collect();
        format!("the preset's: {}", each.join(", "))
    }
}

fn num(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Every option of the API.
pub fn options() -> Vec<OptionSpec> {
    let sh = ShuffleParams::default();
    let mut v = vec![
        opt("metric", BUILD, Kind::Name("metrics"), "l2".into(),
            "similarity: \"l2\" (squared Euclidean), \"ip\" (inner product) or \"cosine\" (float data only; vectors are normalised)"),
        opt("preset", BUILD, Kind::Name("presets"), "auto".into(),
            "a composition of components from one seed paper: \"diskann\" (medoid entry, synchronous beam), \"pipeann\" \
             (navigation graph over 1% of the points, pipelined executor), \"starling\" (block-shuffled layout, navigation \
             graph, block search), \"gorgeous\" (graph-replicated pages, adjacency-first cache, two-stage search), \
             \"alayalaser\" (neighbour codes inside the records, in-degree cache, cluster entry points, adaptive beam; l2 \
             only), \"spfresh\" (a partition index: SPANN postings, LIRE updates; float32 only) or \"auto\" (the planner's \
             rules choose a graph composition; the plan says which rule fired and why each other candidate lost). \
             Explicit options win over the preset's"),
        opt("ids", BUILD, Kind::Ids, "row numbers".into(),
            "external ids, one per row: unique integers in 0..2**63 (floats are refused, not truncated); searches return them"),
        opt("R", BUILD, int(1), by_preset(|d| d.r.to_string()), "maximum graph degree"),
        opt("build_L", BUILD, int(1), by_preset(|d| d.build_l.to_string()), "build candidate list size"),
        opt("alpha", BUILD, float(1.0, None), by_preset(|d| num(d.alpha as f64)),
            "pruning parameter α ≥ 1, applied in rounds as DiskANN does: α = 1 first, then ×1.2 up to alpha"),
        opt("passes", BUILD, int(1), by_preset(|d| d.passes.to_string()), "Vamana passes"),
        opt("saturate", BUILD, Kind::Bool, "off".into(),
            "after α-pruning, fill adjacency lists up to R with the nearest remaining candidates, as DiskANN's disk builds do"),
        opt("pq_bytes", BUILD, int(1), "DiskANN's rule, floor(left / n), on what the fixed structures leave of the budget".into(),
            "PQ code bytes per vector"),
        opt("memory_budget", BUILD, Kind::Budget,
            by_preset(|d| format!("{} of the raw vectors", num(d.budget_fraction))) + ", raised to what the index needs at least",
            "the search memory budget, binding: every byte an open index holds (PQ codes and codebook, entry structures, \
             layout map, the search workers' scratch, the cache) fits in it. Bytes, \"512MB\" (10^6·512), \"2GiB\" (2^31), \
             or a float in (0, 1] = a fraction of the raw vector bytes; a budget below the index's minimum is refused, naming it"),
        opt("build_memory_budget", BUILD, Kind::Budget, "the plan's".into(),
            "memory the build may use (same forms); when data and graph do not fit, the build partitions the data and merges \
             the parts (a warning says when the parts are small enough to cost recall); a budget no plan fits is refused, \
             stating the least that does"),
        opt("page_size", BUILD, Kind::IntChoice("page_sizes"), by_preset(|d| d.page_size.to_string()), "page size in bytes"),
        opt("threads", BUILD, int(1), "all cores".into(), "build threads"),
        opt("seed", BUILD, int(0), "0".into(), "RNG seed (builds are deterministic for a fixed seed and thread count)"),
        opt("overwrite", BUILD, Kind::Bool, "off".into(),
            "replace an existing index at the path (only a directory that holds a nearline index is ever replaced, atomically)"),
        opt("nav_sample", BUILD, float(0.0, Some(0.5)), by_preset(|d| num(d.nav_sample)),
            "build an in-memory navigation graph (Starling, PipeANN) over this fraction of the vectors, in [0, 0.5]; 0 builds none"),
        opt("entry_clusters", BUILD, int(0), by_preset(|d| d.entry_clusters.to_string()),
            "k-means centroids (AlayaLaser: 300-500) whose nearest nodes are kept as entry points; 0 builds none"),
        opt("layout", BUILD, Kind::Name("layouts"), by_preset(|d| d.layout.name().to_string()),
            "record placement on disk: \"id\" (DiskANN), \"shuffled\" (Starling's block shuffling; the node→page map stays \
             in memory, counted in the budget), \"replicated\" (Gorgeous: one page per node also carrying its nearest \
             neighbours' adjacency lists), \"coded\" (AlayaLaser: records in ID order carrying their neighbours' RaBitQ \
             codes, vectors stored after a PCA; l2 only) or \"pq_coded\" (AiSAQ: records in ID order carrying their \
             neighbours' PQ codes; only the PQ codebook stays in memory)"),
        opt("shuffle", BUILD, Kind::Name("shuffles"), sh.algo.name().into(),
            "block-shuffling algorithm of a shuffled layout: \"bnp\", \"bnf\" or \"bns\" (Starling)"),
        opt("bnf_iters", BUILD, int(1), sh.bnf_iters.to_string(), "BNF's round limit β"),
        opt("bnf_tau", BUILD, float(0.0, None), num(sh.bnf_tau), "BNF stops when a round gains less OR(G) than τ"),
        opt("bns_iters", BUILD, int(1), sh.bns_iters.to_string(), "BNS rounds"),
        opt("disk_budget", BUILD, Kind::Size, "no limit".into(),
            "the most bytes the page file may take (an int or a size such as \"2GiB\"): a replicated layout packs fewer \
             lists per record to fit (down to plain records); a budget below the plain page file is refused, naming it"),
        opt("adjacency", BUILD, Kind::Bool, by_preset(|d| if d.adjacency { "on" } else { "off" }.to_string()),
            "write the adjacency section (every list, breadth-first from the entry points) that an adjacency cache loads"),
        opt("principal_dims", BUILD, int(1), "256 when d ≥ 256, else d".into(),
            "dimensions a coded layout's neighbour codes cover (the leading PCA dimensions; the rest only refine exact distances)"),
        opt("code_bits", BUILD, int(1), "the most whose records still fit the blocks 1-bit codes need".into(),
            "bits per dimension of a coded layout's neighbour codes: 1 (RaBitQ), 2 or 4 (scalar levels of the rotated \
             residual, scored by the same FastScan kernel)"),
        opt("head_ratio", BUILD, Kind::Float { min: 0.0, max: Some(0.5), min_open: true, max_open: false },
            format!("{}, lowered to what memory_budget holds", num(partition::HEAD_RATIO)),
            "partition index: heads (postings) over vectors, in (0, 0.5]"),
        opt("replicas", BUILD, int(1), partition::REPLICAS.to_string(),
            "partition index: most postings a vector is stored in (SPANN's RNG rule)"),
        opt("posting_limit", BUILD, int(1),
            format!("8 × the build's cluster size, at least 32, over the build fill {}", num(partition::BUILD_FILL)),
            "partition index: entries a posting may hold before it is split"),
        opt("merge_threshold", BUILD, int(0), format!("1/16 of the posting limit, at most {}", partition::MERGE_THRESHOLD),
            "partition index: live entries below which a posting is merged away"),
        opt("rng_factor", BUILD, float(0.0, None), "1".into(), "partition index: the RNG rule's factor"),
        opt("closure", BUILD, float(0.0, None), format!("the planner's ({})", num(partition::CLOSURE as f64)),
            "partition index: SPANN's closure ε: a vector also goes into every posting whose head lies within (1 + ε) of \
             its nearest head's distance, up to replicas"),
        opt("reassign_k", BUILD, int(0), partition::REASSIGN_K.to_string(),
            "partition index: postings around a split whose vectors LIRE checks for reassignment"),
        opt("lire", BUILD, Kind::Bool, "on".into(),
            "partition index: LIRE splits, merges and reassigns; off is SPANN+ (appends and garbage collection only), the \
             paper's baseline"),
        opt("recall_target", BUILD, Kind::Float { min: 0.0, max: Some(1.0), min_open: true, max_open: true },
            num(partition::RECALL_TARGET),
            "partition index: the recall@10 the build calibrates the default nprobe for, strictly between 0 and 1 (sample \
             vectors are searched at growing nprobe; info()[\"params\"][\"nprobe\"] holds the choice)"),
        opt("write_ratio", BUILD, Kind::Float { min: 0.0, max: Some(1.0), min_open: false, max_open: false },
            "0".into(),
            "workload hint: the expected share of operations that are inserts or deletes; a graph index built with a \
             memory budget keeps that share (at most half) of what the budget leaves beyond its minimum from the PQ \
             codes, for its update delta (fewer, larger merges for a little code precision); nearline plan shows the \
             reserve and the update strategy"),
        opt("update", &[Stage::Build, Stage::Open], Kind::Choice(&["auto", "in_place", "out_of_place"]),
            "auto".into(),
            "graph index: how inserts and deletes reach the disk graph: \"out_of_place\" (FreshDiskANN: an in-memory \
             delta merged into a new disk graph), \"in_place\" (OdinANN insert, IP-DiskANN delete: the records are \
             rewritten, logged as page images; the diskann and pipeann presets' ID layout only) or \"auto\" (at build: \
             out_of_place; at open: what the build chose)"),
        // ---- open
        opt("memory_budget", OPEN, Kind::Budget, "the budget the index was built with".into(),
            "the search memory budget (bytes, a size string or a fraction of the raw vector bytes), binding: the codes, \
             entry structures, maps, the workers' scratch and the cache all fit in it; what the rest leaves holds the \
             cache. A graph index re-plans its cache without a rebuild; a partition index refuses less than what it \
             holds open (heads, id maps, its threads' buffers), naming that size"),
        opt("cache_nodes", OPEN, int(0), "what the budget leaves".into(),
            "cache exactly this many nodes (they must fit the budget; for an adjacency cache, at most this many lists)"),
        opt("cache", OPEN, Kind::Name("caches"), by_preset(|d| d.cache.name().to_string()),
            "what the cache share holds: \"bfs\" (DiskANN: whole records, breadth-first from the medoid), \"adjacency\" \
             (Gorgeous: adjacency lists first, vectors once every list fits), \"in_degree\" (AlayaLaser: whole records of \
             the most-listed nodes) or \"auto\" (the preset's)"),
        opt("threads", OPEN, int(1), "all cores, fewer when the budget holds fewer".into(),
            "default search threads, whose scratch the budget reserves"),
        opt("io", OPEN, Kind::Name("io_engines"), "auto".into(),
            "I/O engine: \"auto\" (io_uring, falling back to pread; NEARLINE_IO overrides it), \"uring\", \"uring-poll\" \
             (a kernel submission thread and spinning waits: the lowest latency, a busy core per search thread; never \
             chosen by auto) or \"pread\""),
        opt("entry_points", OPEN, int(0), "0".into(),
            "hold the vectors of this many sampled nodes in memory and start each query from the nearest (entry \"sampled\", \
             or \"auto\" on an index without a navigation graph or centroid entries)"),
        opt("entry", OPEN, Kind::Name("entry_kinds"), "auto".into(),
            "where each query's disk search starts: \"auto\" (the navigation graph if the index has one, else its centroid \
             entries, else sampled entries when entry_points > 0, else the medoid), \"medoid\", \"sampled\", \"nav\" or \
             \"centroids\""),
        opt("nav_L", OPEN, int(1), by_preset(|d| d.nav_l.to_string()), "list size of the navigation-graph search"),
        opt("nav_seeds", OPEN, int(1), by_preset(|d| d.nav_seeds.to_string()),
            "navigation-graph seeds per query (at most nav_L)"),
        opt("durability", OPEN, Kind::Choice(&["sync", "buffered"]), "sync".into(),
            "when insert and delete return: \"sync\" (after their log record is fsynced, so they survive power loss) or \
             \"buffered\" (after it is written: they survive the process being killed, not an OS crash)"),
        opt("background_updates", OPEN, Kind::Bool, "on".into(),
            "partition index: run splits, merges and reassignments in a background thread (off: only when maintain() is \
             called). Graph index: merge a full delta in a background thread while inserts go on (off: the insert that \
             fills it runs the merge)"),
        opt("read_only", OPEN, Kind::Bool, "off".into(),
            "open for reading only: needs no write permission and runs beside the one writer of another process, seeing \
             every update it acknowledged before each search began; insert, delete, checkpoint and maintain are refused"),
        // ---- search and range search
        opt("k", SEARCH, int(1), "10".into(),
            "neighbours per query (beyond the index's size the extra slots hold id -1 and an infinite distance)"),
        opt("L", SEARCH, int(1), format!("max(k, {DEFAULT_L}), or the preset's L"),
            "candidate list size (larger is more accurate); a search whose workers need more scratch than the budget \
             reserves borrows from the cache, and is refused only when even an empty cache could not make room. \
             Partition index: the list size of the in-memory head search"),
        opt("L", RANGE, int(1), DEFAULT_L.to_string(), "initial candidate list size of a range search"),
        opt("W", QUERY, Kind::Int { min: 1 }, by_preset(|d| d.width.to_string()),
            "beam width (1..64): reads issued per hop for the beam executor, the most reads in flight per query for the pipeline"),
        opt("threads", QUERY, int(1), "the index's".into(), "search threads"),
        opt("executor", QUERY, Kind::Name("executors"),
            by_preset(|d| match d.executor {
                PresetExecutor::ByRule => "auto".to_string(),
                PresetExecutor::Beam => "beam".to_string(),
                PresetExecutor::Pipeline => "pipeline".to_string(),
            }),
            "\"beam\" (DiskANN: W reads per hop, the next hop once the hop's pages are processed), \"pipeline\" (PipeANN: \
             reads kept in flight, pages processed as they arrive, adaptive width up to W) or \"auto\" (the preset's; for \
             diskann the planner's rule: the pipeline when a page holds fewer than two records, else the beam; the beam \
             whenever a beam-only option is set)"),
        opt("adaptive_beam", QUERY, Kind::Bool, by_preset(|d| if d.adaptive_beam { "on" } else { "off" }.to_string()),
            "beam only: width min(2**i, W) at hop i (AlayaLaser)"),
        opt("early_dispatch", QUERY, fraction(),
            by_preset(|d| d.early_dispatch.map_or_else(|| "off".to_string(), |x| num(x as f64))),
            "beam only: issue the next hop once this share of the current hop's pages is processed; late pages fold in \
             when they arrive (AlayaLaser)"),
        opt("queries_in_flight", QUERY, Kind::IntOrAuto { max: 64 },
            format!("auto: {} per thread when the batch has that many and the budget leaves the workers room", preset::AUTO_QUERIES_IN_FLIGHT),
            "queries each search thread interleaves on its I/O queue (1..64) or \"auto\"; 1 gives each query its thread alone"),
        opt("page_search", QUERY, Kind::Name("page_searches"), "auto: block search on a shuffled layout, else targets".into(),
            "what a search does with an arrived page: \"targets\" (DiskANN: the records it was read for), \"block\" \
             (Starling's block search) or \"auto\""),
        opt("sigma", QUERY, fraction(), by_preset(|d| num(d.sigma as f64)), "block search's pruning ratio σ in (0, 1]"),
        opt("refine_ratio", QUERY, fraction(), by_preset(|d| num(d.refine_ratio as f64)),
            "two-stage search (Gorgeous; an adjacency cache or a replicated layout): after the traversal on PQ distances, \
             the best ceil(refine_ratio · L) list entries (at least k) without an exact distance are read and ranked exactly"),
        opt("filter_ratio", QUERY, fraction(), by_preset(|d| num(d.filter_ratio as f64)),
            "replicated layouts: a neighbour whose list a page carried is expanded without reading its page when its PQ \
             distance is within this fraction of the list's worst"),
        opt("repeatable", QUERY, Kind::Bool, "on".into(),
            "each query processes its pages in the order it issued the reads, so the same query on the same index returns \
             the same ids, distances and statistics whatever the timing; off processes pages as they arrive"),
        opt("nprobe", SEARCH, int(1), "calibrated at build for recall_target (info()[\"params\"][\"nprobe\"]), else 32".into(),
            "partition index: postings read per query; all its reads are in flight at once"),
        opt("probe_cut", SEARCH, float(0.0, None), "none".into(),
            "partition index: SPANN's latency cut: a posting is read only when its head lies within (1 + probe_cut) of the \
             nearest head's distance (l2 and cosine)"),
        OptionSpec {
            cli: Some("--range-ratio"),
            metavar: Some("PHI"),
            ..opt("ratio", RANGE, fraction(), num(preset::DEFAULT_RANGE_RATIO as f64),
                "φ: a range search doubles its list (up to max_L) whenever the list is exhausted while results within the \
                 radius fill at least this share of it")
        },
        opt("max_L", RANGE, int(1), "1024 × L, capped at 2**22".into(),
            "the largest list the doubling may reach; a query whose answer is larger than about ratio · max_L is cut short"),
        opt("entry_cutoff", RANGE, float(1.0, None), "off".into(),
            "a factor c ≥ 1: a query whose nearest entry point (in memory, exact distance) lies beyond c × the radius ends \
             with no results and reads no page (l2 and cosine; needs a navigation graph, sampled or centroid entries)"),
    ];
    for o in &mut v {
        if o.metavar.is_none() {
            o.metavar = match o.name {
                "early_dispatch" | "nav_sample" | "refine_ratio" | "filter_ratio"
                | "head_ratio" => Some("F"),
                "closure" | "probe_cut" => Some("EPS"),
                "bnf_iters" => Some("BETA"),
                "bnf_tau" => Some("TAU"),
                "queries_in_flight" => Some("Q"),
                "entry_cutoff" => Some("C"),
                _ => None,
            };
        }
    }
    v
}

/// The option names a stage accepts, in declaration order.
pub fn option_names(stage: Stage) -> Vec<&'static str> {
    options()
        .into_iter()
        .filter(|o| o.stages.contains(&stage))
        .map(|o| o.name)
        .collect()
}

fn kind_json(k: &Kind) -> Value {
    match k {
        Kind::Int { min } => json!({"type": "int", "min": min}),
        Kind::IntChoice(list) => json!({"type": "int", "choices_from": list}),
        Kind::Float {
            min,
            max,
            min_open,
            max_open,
        } => {
            json!({"type": "float", "min": min, "max": max, "min_open": min_open, "max_open": max_open})
        }
        Kind::Bool => json!({"type": "bool"}),
        Kind::Name(list) => json!({"type": "name", "choices_from": list}),
        Kind::Choice(names) => json!({"type": "name", "choices": names}),
        Kind::Budget => json!({"type": "budget"}),
        Kind::Size => json!({"type": "size"}),
        Kind::IntOrAuto { max } => json!({"type": "int_or_auto", "min": 1, "max": max}),
        Kind::Ids => json!({"type": "ids"}),
    }
}

/// The whole description, JSON: `options` (each with `name`, `stages`, its
/// kind's fields, `default`, `doc`, `cli`, `metavar`), `stats` (each
/// `name`, `dtype`, `doc`), `vocabulary` and `defaults`.
pub fn schema_json() -> Value {
    let opts: Vec<Value> = options()
        .iter()
        .map(|o| {
            let mut j = kind_json(&o.kind);
            let m = j.as_object_mut().expect("kind_json gives an object");
            m.insert("name".into(), json!(o.name));
            m.insert(
                "stages".into(),
                json!(o.stages.iter().map(|s| s.name()).collect::<Vec<_>>()),
            );
            m.insert("default".into(), json!(o.default));
            m.insert("doc".into(), json!(o.doc));
            let flag = o
                .cli
                .map(str::to_string)
                .unwrap_or_else(|| format!("--{}", o.name.replace('_', "-")));
            m.insert("cli".into(), json!(flag));
            m.insert("metavar".into(), json!(o.metavar));
            j
        })
        .collect();
    let stats: Vec<Value> = STATS
        .iter()
        .map(|s| json!({"name": s.name, "dtype": s.dtype(), "doc": s.doc}))
        .collect();
    json!({
        "options": opts,
        "stats": stats,
        "vocabulary": vocabulary(),
        "defaults": defaults_json(),
    })
}

/// The names every API accepts, from one source (Python and the CLI take
/// their choice lists from here), with each stage's option names.
pub fn vocabulary() -> Value {
    let mut by_stage = serde_json::Map::new();
    for &s in Stage::ALL {
        by_stage.insert(s.name().into(), json!(option_names(s)));
    }
    json!({
        "presets": PresetChoice::names(),
        "executors": ExecutorChoice::names(),
        "page_searches": PageChoice::names(),
        "caches": CacheChoice::names(),
        "entry_kinds": EntryChoice::names(),
        "layouts": LayoutKind::names(),
        "shuffles": ShuffleAlgo::names(),
        "metrics": ["l2", "ip", "cosine"],
        "dtypes": ["float32", "float16", "uint8", "int8"],
        "io_engines": super::IO_ENGINES,
        "page_sizes": [4096, 8192, 16384],
        "index_kinds": crate::format::IndexKind::names(),
        "options": by_stage,
    })
}

/// The defaults every API uses when an option is left open.
pub fn defaults_json() -> Value {
    let p = |x: Preset| {
        let d = defaults(x);
        json!({
            "R": d.r, "build_L": d.build_l, "alpha": d.alpha, "passes": d.passes,
            "page_size": d.page_size, "layout": d.layout.name(), "nav_sample": d.nav_sample,
            "entry_clusters": d.entry_clusters, "W": d.width, "nav_L": d.nav_l,
            "nav_seeds": d.nav_seeds, "sigma": d.sigma, "memory_budget": d.budget_fraction,
            "L": d.l, "cache": d.cache.name(), "adjacency": d.adjacency,
            "refine_ratio": d.refine_ratio, "filter_ratio": d.filter_ratio,
            "executor": match d.executor {
                PresetExecutor::ByRule => "auto",
                PresetExecutor::Beam => "beam",
                PresetExecutor::Pipeline => "pipeline",
            },
        })
    };
    let mut presets = serde_json::Map::new();
    for &x in Preset::ALL {
        if x == Preset::Spfresh {
            // A partition index: its own parameters (planner::partition).
            presets.insert(
                x.name().into(),
                json!({
                    "kind": "partition",
                    "head_ratio": partition::HEAD_RATIO,
                    "replicas": partition::REPLICAS,
                    "rng_factor": 1.0,
                    "reassign_k": partition::REASSIGN_K,
                    "posting_limit": "8 x the build's cluster size / build_fill",
                    "build_fill": partition::BUILD_FILL,
                    "merge_threshold": "1/16 of the posting limit, at most 10",
                    "lire": true,
                    "recall_target": partition::RECALL_TARGET,
                    "nprobe": "calibrated at build for recall_target",
                }),
            );
            continue;
        }
        presets.insert(x.name().into(), p(x));
    }
    json!({
        "L": DEFAULT_L,
        "queries_in_flight": "auto",
        "range_ratio": preset::DEFAULT_RANGE_RATIO,
        "presets": presets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_per_stage_and_docs_are_given() {
        for &s in Stage::ALL {
            let names = option_names(s);
            let set: HashSet<_> = names.iter().collect();
            assert_eq!(
                set.len(),
                names.len(),
                "{} declares an option twice",
                s.name()
            );
        }
        for o in options() {
            assert!(
                !o.doc.is_empty() && !o.default.is_empty(),
                "{} lacks a doc or default",
                o.name
            );
            assert!(!o.stages.is_empty(), "{} has no stage", o.name);
        }
    }

    #[test]
    fn every_vocabulary_list_an_option_names_exists() {
        let v = vocabulary();
        for o in options() {
            if let Kind::Name(list) | Kind::IntChoice(list) = o.kind {
                assert!(
                    v.get(list).is_some_and(Value::is_array),
                    "{}: no vocabulary list {list}",
                    o.name
                );
            }
        }
    }

    #[test]
    fn preset_defaults_are_rendered_from_the_presets() {
        let w = options()
            .into_iter()
            .find(|o| o.name == "W")
            .expect("W is declared");
        let d = defaults(Preset::Diskann).width;
        assert!(w.default.contains(&format!("diskann {d}")), "{}", w.default);
        let json = schema_json();
        assert!(json["stats"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["name"] == "refined")));
    }
}
