//! Building and opening an index: the composition of data, quantizer, graph,
//! layout, cache and executor.
//!
//! An index is a directory: `manifest.json`, `pages.bin` (the page file),
//! `pq_codebook.bin`, `pq_codes.bin` and, when external ids were given,
//! `ids.bin` (u64 little-endian). A build writes into a hidden temporary
//! directory and renames it into place only when complete, so a cancelled or
//! failed build never leaves a directory that looks like a valid index.

use crate::cache::NodeCache;
use crate::data::dtype::{DType, Element};
use crate::data::files;
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::graph::nav::NavGraph;
use crate::graph::{build_with_budget, VamanaParams};
use crate::io::{open_direct, EngineKind};
use crate::layout::format::{
    BuildSpec, BuildStats, LayoutInfo, Manifest, SectionInfo, FORMAT_MAJOR, FORMAT_MINOR,
    FORMAT_NAME,
};
use crate::layout::page::PageGeometry;
use crate::layout::shuffle::{overlap_ratio, shuffle_blocks, ShuffleParams};
use crate::layout::writer::write_pages;
use crate::layout::{AnyLayout, IdLayout, LayoutKind, ShuffleInfo, ShuffledLayout};
use crate::quant::pq::PqCodebook;
use crate::search::entry::{
    build_centroid_entries, resolve_kind, EntryKind, EntryPoints, EntrySet, DEFAULT_NAV_L,
    DEFAULT_NAV_SEEDS, MAX_NAV_L, MAX_NAV_SEEDS,
};
use crate::search::pool::{BatchResult, WorkerPool};
use crate::search::{AnyScorer, ExecutorKind, IndexData, PqScorer, QueryStats, SearchParams};
use crate::util::{BigBuf, Budget, HugeBytes};
use crate::{with_dtype, Error, Result};
use rand::seq::index::sample;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// Rows sampled to train PQ (DiskANN samples up to 256K points).
pub const PQ_TRAIN_SAMPLE: usize = 256_000;

/// Progress callback: `(stage, done, total)`.
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + Sync);

/// Everything a build needs besides the data.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub metric: Metric,
    pub preset: String,
    pub r: usize,
    pub build_l: usize,
    pub alpha: f32,
    pub passes: usize,
    /// Fill pruned adjacency lists up to R (DiskANN's disk builds do).
    pub saturate: bool,
    /// PQ bytes per vector; `None` derives them from `memory_budget` as DiskANN does.
    pub pq_bytes: Option<usize>,
    pub memory_budget: Budget,
    /// `None`: unlimited (a one-shot build).
    pub build_memory_budget: Option<Budget>,
    pub page_size: usize,
    /// `None`: all cores.
    pub threads: Option<usize>,
    pub seed: u64,
    /// External ids, one per row (default 0..n).
    pub ids: Option<Vec<u64>>,
    pub overwrite: bool,
    /// Sampling rate of the in-memory navigation graph (Starling, PipeANN:
    /// ~0.01), in `[0, 0.5]`; 0 builds none.
    pub nav_sample: f64,
    /// k-means centroids whose nearest nodes become entry points
    /// (AlayaLaser: 300-500); 0 builds none.
    pub entry_clusters: usize,
    /// Record placement; `None`: the preset's (shuffled for `starling`,
    /// the ID layout otherwise).
    pub layout: Option<LayoutKind>,
    /// How a shuffled layout is made (algorithm, BNF's β and τ); the seed
    /// is the build's.
    pub shuffle: ShuffleParams,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            metric: Metric::L2,
            preset: "auto".into(),
            r: 64,
            build_l: 100,
            alpha: 1.2,
            passes: 2,
            saturate: false,
            pq_bytes: None,
            memory_budget: Budget::Fraction(0.125),
            build_memory_budget: None,
            page_size: 4096,
            threads: None,
            seed: 0,
            ids: None,
            overwrite: false,
            nav_sample: 0.0,
            entry_clusters: 0,
            layout: None,
            shuffle: ShuffleParams::default(),
        }
    }
}

/// Default thread count: the cores available to this process.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub use crate::quant::pq::pq_bytes_for_budget;

/// Removes a temporary build directory unless the build committed it.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn check_options(opts: &BuildOptions, n: usize, dtype: DType) -> Result<()> {
    if n == 0 {
        return Err(Error::arg("cannot build an index over 0 vectors"));
    }
    if n > u32::MAX as usize - 1 {
        return Err(Error::arg(format!(
            "{n} vectors exceed the 2^32 − 1 an index can hold"
        )));
    }
    if opts.r == 0 || opts.r > 1024 {
        return Err(Error::arg(format!("R={} must be in 1..=1024", opts.r)));
    }
    if opts.build_l == 0 {
        return Err(Error::arg("build_L must be at least 1"));
    }
    if !opts.alpha.is_finite() || opts.alpha < 1.0 {
        return Err(Error::arg(format!(
            "alpha={} must be a finite number ≥ 1.0",
            opts.alpha
        )));
    }
    if opts.passes == 0 || opts.passes > 4 {
        return Err(Error::arg(format!(
            "passes={} must be in 1..=4",
            opts.passes
        )));
    }
    if matches!(opts.threads, Some(0)) {
        return Err(Error::arg("threads must be at least 1"));
    }
    if opts.metric == Metric::Cosine && !dtype.is_float() {
        return Err(Error::arg(format!(
            "the cosine metric needs float32 or float16 vectors (got {dtype}); normalise the data and use \"ip\" instead"
        )));
    }
    if let Some(ids) = &opts.ids {
        if ids.len() != n {
            return Err(Error::arg(format!(
                "ids has {} entries, but there are {n} vectors",
                ids.len()
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&x| x > i64::MAX as u64) {
            return Err(Error::arg(format!(
                "id {bad} does not fit in a signed 64-bit integer"
            )));
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::arg(format!(
                "ids must be unique: {} appears more than once",
                w[0]
            )));
        }
    }
    crate::graph::nav::check_nav_sample(opts.nav_sample)?;
    crate::search::entry::check_entry_clusters(opts.entry_clusters, n)?;
    crate::planner::resolve_preset(&opts.preset)?;
    Ok(())
}

/// Builds an index from a vector file (memory-mapped when possible).
pub fn build_from_file(
    input: &Path,
    dtype_hint: Option<DType>,
    dir: &Path,
    opts: &BuildOptions,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Manifest> {
    let info = files::probe(input, dtype_hint)?;
    with_dtype!(info.dtype, T, {
        let m = files::open_vectors::<T>(input)?;
        build(m, dir, opts, progress, cancel)
    })
}

/// Builds an index over `data` into the directory `dir`.
pub fn build<T: Element>(
    data: Matrix<T>,
    dir: &Path,
    opts: &BuildOptions,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Manifest> {
    let n = data.n();
    let dim = data.dim();
    check_options(opts, n, T::DTYPE)?;
    let preset = crate::planner::resolve_preset(&opts.preset)?;
    // What the preset sets when the caller left it open.
    let defaults = crate::planner::preset_defaults(preset);
    let opts = &BuildOptions {
        nav_sample: if opts.nav_sample > 0.0 {
            opts.nav_sample
        } else {
            defaults.nav_sample
        },
        ..opts.clone()
    };
    let geo = PageGeometry::new(opts.page_size, dim * T::DTYPE.size(), opts.r, n)?;
    let layout_kind = opts.layout.unwrap_or(defaults.layout);
    opts.shuffle.check()?;
    if dir.exists() && !opts.overwrite {
        return Err(Error::arg(format!(
            "{} already exists; pass overwrite=True (CLI: --overwrite) to replace it",
            dir.display()
        )));
    }
    let name = dir
        .file_name()
        .ok_or_else(|| {
            Error::arg(format!(
                "{} is not a valid index directory name",
                dir.display()
            ))
        })?
        .to_string_lossy()
        .to_string();
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    }
    let threads = opts.threads.unwrap_or_else(default_threads);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Engine(format!("cannot start {threads} build threads: {e}")))?;
    let tmp = TempDir {
        path: parent.join(format!(".{name}.building-{}", std::process::id())),
        keep: false,
    };
    let _ = std::fs::remove_dir_all(&tmp.path);
    std::fs::create_dir(&tmp.path).map_err(|e| Error::io(&tmp.path, e))?;
    let mut tmp = tmp;

    let manifest = pool.install(|| -> Result<Manifest> {
        let t0 = Instant::now();
        check_finite_streaming(&data)?;
        let data = if opts.metric == Metric::Cosine {
            normalized(&data)?
        } else {
            data
        };
        let raw = (n * dim * T::DTYPE.size()) as u64;
        let mem_budget = opts.memory_budget.resolve(raw);
        let pq_bytes = match opts.pq_bytes {
            Some(b) if b == 0 || b > dim => {
                return Err(Error::arg(format!(
                    "pq_bytes={b} must be in 1..={dim} (the dimension)"
                )))
            }
            Some(b) => b,
            None => pq_bytes_for_budget(n, dim, mem_budget),
        };
        let build_budget = opts
            .build_memory_budget
            .map(|b| b.resolve(raw))
            .unwrap_or(u64::MAX);

        // 1. Product quantization: train on a sample, encode in streaming chunks.
        let tq = Instant::now();
        progress("pq", 0, n as u64);
        let sample_rows = pq_sample_rows(n, dim, build_budget);
        let codebook = train_pq(&data, pq_bytes, opts.metric, opts.seed, sample_rows)?;
        crate::util::return_freed_memory();
        let mut codes: BigBuf<u8> = BigBuf::zeroed(n * pq_bytes);
        let chunk = 65_536;
        for start in (0..n).step_by(chunk) {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            let end = (start + chunk).min(n);
            let view = MatrixView::new(&data.as_slice()[start * dim..end * dim], end - start, dim)?;
            let c = codebook.encode_all(view);
            codes[start * pq_bytes..end * pq_bytes].copy_from_slice(&c);
            data.release_rows(start, end);
            progress("pq", end as u64, n as u64);
        }
        let pq_seconds = tq.elapsed().as_secs_f64();

        // 2. The graph (one-shot or sharded within the build budget).
        let tg = Instant::now();
        let params = VamanaParams {
            r: opts.r,
            l: opts.build_l,
            alpha: opts.alpha,
            passes: opts.passes,
            seed: opts.seed,
            saturate: opts.saturate,
            ..VamanaParams::default()
        };
        let gp = |d: u64, t: u64| progress("graph", d, t);
        // The PQ codes stay resident through the graph build: the graph gets the rest.
        let graph_budget = build_budget.saturating_sub(codes.len() as u64);
        let esz = T::DTYPE.size();
        let shards = if crate::graph::estimate_build_bytes(n, dim, esz, opts.r) <= graph_budget {
            1
        } else {
            crate::graph::sharded::plan_shards(n, dim, esz, opts.r, graph_budget)
                .map_or(0, |p| p.shards)
        };
        let (graph, medoid) =
            build_with_budget(&data, opts.metric, &params, graph_budget, &gp, cancel)?;
        let graph_seconds = tg.elapsed().as_secs_f64();

        // 3. The placement, the page file and the in-memory sections.
        let rpb = geo.records_per_block;
        let (layout, shuffle_info, or_g) = match layout_kind {
            LayoutKind::Id => {
                let ids: Vec<u32> = (0..n as u32).collect();
                let or_g = overlap_ratio(&graph, rpb, &ids);
                (AnyLayout::Id(IdLayout::new(geo, n)), None, or_g)
            }
            LayoutKind::Shuffled => {
                progress("shuffle", 0, 1);
                let ts = Instant::now();
                let sp = ShuffleParams {
                    seed: opts.seed,
                    ..opts.shuffle
                };
                let sh = shuffle_blocks(&graph, rpb, &sp, cancel)?;
                let or_g = sh.overlap_ratio;
                let info = ShuffleInfo {
                    algorithm: sp.algo.name().into(),
                    bnf_iters: sp.bnf_iters,
                    bnf_tau: sp.bnf_tau,
                    bns_iters: sp.bns_iters,
                    iterations: sh.iterations,
                    id_overlap_ratio: sh.id_overlap_ratio,
                    seconds: ts.elapsed().as_secs_f64(),
                };
                let l = ShuffledLayout::new(geo, sh.loc).map_err(|m| {
                    Error::Engine(format!(
                        "block shuffling produced an invalid placement: {m}"
                    ))
                })?;
                progress("shuffle", 1, 1);
                (AnyLayout::Shuffled(l), Some(info), or_g)
            }
        };
        progress("layout", 0, geo.n_blocks);
        let pages = tmp.path.join("pages.bin");
        write_pages(&pages, &layout, &data, &graph, cancel)?;
        progress("layout", geo.n_blocks, geo.n_blocks);
        let mut sections = BTreeMap::new();
        sections.insert(
            "pages".to_string(),
            SectionInfo {
                file: "pages.bin".into(),
                kind: "pages".into(),
                bytes: geo.file_bytes(),
                crc32c: None,
            },
        );
        sections.insert(
            "pq_codebook".into(),
            write_section(
                &tmp.path,
                "pq_codebook.bin",
                "pq_codebook",
                &codebook.to_bytes(),
            )?,
        );
        sections.insert(
            "pq_codes".into(),
            write_section(&tmp.path, "pq_codes.bin", "pq_codes", &codes)?,
        );
        let mean_degree = graph.mean_degree();
        // The entry-point structures come last, with the codes and the graph
        // freed: only the (streamed) data and their own samples are resident.
        drop(codes);
        drop(graph);
        crate::util::return_freed_memory();

        // 4. Optional entry points: the navigation graph and centroid entries.
        let te = Instant::now();
        if opts.nav_sample > 0.0 {
            progress("nav", 0, 1);
            if let Some(nav) =
                NavGraph::build(&data, opts.metric, opts.nav_sample, opts.seed, cancel)?
            {
                sections.insert(
                    "nav_graph".into(),
                    write_section(&tmp.path, "nav_graph.bin", "nav_graph", &nav.to_bytes())?,
                );
            }
            progress("nav", 1, 1);
        }
        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        if opts.entry_clusters > 0 {
            progress("centroids", 0, 1);
            if let Some(set) =
                build_centroid_entries(&data, opts.entry_clusters, opts.seed, build_budget)?
            {
                sections.insert(
                    "entry_centroids".into(),
                    write_section(
                        &tmp.path,
                        "entry_centroids.bin",
                        "entry_centroids",
                        &set.to_centroid_bytes(),
                    )?,
                );
            }
            progress("centroids", 1, 1);
        }
        let entry_seconds = te.elapsed().as_secs_f64();
        if let Some(ids) = &opts.ids {
            let bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
            sections.insert(
                "ids".into(),
                write_section(&tmp.path, "ids.bin", "external_ids_u64", &bytes)?,
            );
        }
        let location = match &layout {
            AnyLayout::Id(_) => SectionInfo {
                file: String::new(),
                kind: "identity".into(),
                bytes: 0,
                crc32c: None,
            },
            AnyLayout::Shuffled(l) => {
                write_section(&tmp.path, "id_to_location.bin", "block_map", &l.to_bytes())?
            }
        };
        drop(layout);
        sections.insert("id_to_location".into(), location);
        let manifest = Manifest {
            format: FORMAT_NAME.into(),
            format_major: FORMAT_MAJOR,
            format_minor: FORMAT_MINOR,
            created_by: format!("nearline {}", env!("CARGO_PKG_VERSION")),
            spec: BuildSpec {
                preset: preset.into(),
                r: opts.r,
                build_l: opts.build_l,
                alpha: opts.alpha,
                passes: opts.passes,
                saturate: opts.saturate,
                pq_bytes,
                memory_budget: mem_budget,
                build_memory_budget: if build_budget == u64::MAX {
                    0
                } else {
                    build_budget
                },
                page_size: opts.page_size,
                seed: opts.seed,
                threads,
                nav_sample: opts.nav_sample,
                entry_clusters: opts.entry_clusters,
            },
            dtype: T::DTYPE,
            metric: opts.metric,
            dim,
            n,
            medoid,
            layout: LayoutInfo {
                kind: layout_kind.name().into(),
                page_size: geo.page_size,
                block_size: geo.block_size,
                record_size: geo.record_size,
                records_per_block: geo.records_per_block,
                n_blocks: geo.n_blocks,
                max_degree: geo.max_degree,
                overlap_ratio: Some(or_g),
                shuffle: shuffle_info,
            },
            wal_sequence: 0,
            sections,
            build_stats: BuildStats {
                seconds: t0.elapsed().as_secs_f64(),
                graph_seconds,
                pq_seconds,
                mean_degree,
                shards,
                entry_seconds,
            },
        };
        manifest.write(&tmp.path)?;
        Ok(manifest)
    })?;
    // What the phases freed in the allocator's arenas goes back now, not
    // when the process ends.
    crate::util::return_freed_memory();

    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::rename(&tmp.path, dir).map_err(|e| Error::io(dir, e))?;
    tmp.keep = true;
    Ok(manifest)
}

/// Checks every value is finite, in chunks whose mapped pages are released
/// afterwards so a streamed input never becomes resident all at once.
fn check_finite_streaming<T: Element>(data: &Matrix<T>) -> Result<()> {
    let (n, dim) = (data.n(), data.dim());
    let chunk = 65_536;
    for start in (0..n).step_by(chunk) {
        let end = (start + chunk).min(n);
        let view = MatrixView::new(&data.as_slice()[start * dim..end * dim], end - start, dim)?;
        files::check_finite("input vectors", view).map_err(|e| match e {
            // Row numbers in the message are relative to the chunk: re-issue with the global row.
            Error::InvalidArgument(m) => Error::InvalidArgument(rebase_row(&m, start)),
            other => other,
        })?;
        data.release_rows(start, end);
    }
    Ok(())
}

/// Rewrites "row R" in a message to "row R+offset".
fn rebase_row(msg: &str, offset: usize) -> String {
    if let Some(i) = msg.find("row ") {
        let rest = &msg[i + 4..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(r) = digits.parse::<usize>() {
            return format!("{}row {}{}", &msg[..i], r + offset, &rest[digits.len()..]);
        }
    }
    msg.to_string()
}

fn normalized<T: Element>(data: &Matrix<T>) -> Result<Matrix<T>> {
    let dim = data.dim();
    let mut out: Vec<T> = Vec::with_capacity(data.n() * dim);
    let mut row = vec![0f32; dim];
    for i in 0..data.n() {
        for (r, x) in row.iter_mut().zip(data.row(i)) {
            *r = x.to_f32();
        }
        crate::distance::normalize(&mut row);
        for &v in &row {
            out.push(T::from_f32(v).ok_or_else(|| {
                Error::arg(format!("row {i} cannot be normalised in {}", T::DTYPE))
            })?);
        }
    }
    Matrix::from_vec(out, data.n(), dim)
}

/// Rows of the PQ training sample: DiskANN's 256K, fewer when half the build
/// budget cannot hold them as f32 (k-means scratch takes the other half).
fn pq_sample_rows(n: usize, dim: usize, build_budget: u64) -> usize {
    let by_budget = (build_budget / 2 / (dim as u64 * 4).max(1)).min(usize::MAX as u64) as usize;
    n.min(PQ_TRAIN_SAMPLE).min(by_budget.max(1024))
}

fn train_pq<T: Element>(
    data: &Matrix<T>,
    m: usize,
    metric: Metric,
    seed: u64,
    max_rows: usize,
) -> Result<PqCodebook> {
    let n = data.n();
    let dim = data.dim();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5051_5f54_5241_494e);
    let take = max_rows.min(n);
    let mut rows: Vec<usize> = if n <= take {
        (0..n).collect()
    } else {
        sample(&mut rng, n, take).into_vec()
    };
    rows.sort_unstable();
    let mut sample_f: BigBuf<f32> = BigBuf::zeroed(rows.len() * dim);
    let mut released = 0;
    for (j, &r) in rows.iter().enumerate() {
        for (o, x) in sample_f[j * dim..(j + 1) * dim].iter_mut().zip(data.row(r)) {
            *o = x.to_f32();
        }
        // Rows are visited in order: drop mapped pages behind us as we go.
        if r >= released + 8192 {
            data.release_rows(released, r);
            released = r;
        }
    }
    data.release_rows(0, n);
    PqCodebook::train(&sample_f, dim, m, metric, seed)
}

fn write_section(dir: &Path, file: &str, kind: &str, bytes: &[u8]) -> Result<SectionInfo> {
    let path = dir.join(file);
    std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
    Ok(SectionInfo {
        file: file.into(),
        kind: kind.into(),
        bytes: bytes.len() as u64,
        crc32c: Some(crc32c::crc32c(bytes)),
    })
}

/// The file of section `name` (the manifest path when it is missing).
fn section_path(dir: &Path, m: &Manifest, name: &str) -> PathBuf {
    match m.sections.get(name) {
        Some(s) => dir.join(&s.file),
        None => dir.join(crate::layout::format::MANIFEST_FILE),
    }
}

fn read_section(dir: &Path, m: &Manifest, name: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let s = m.section(&dir.join(crate::layout::format::MANIFEST_FILE), name)?;
    let path = dir.join(&s.file);
    // The size is checked before reading, and no more than it is read: a
    // damaged manifest may name a file that never ends (a device, a pipe).
    let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
    if len != s.bytes {
        return Err(section_size_error(&path, name, len, s.bytes));
    }
    let mut bytes = Vec::new();
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(&path, e))?;
    check_section(&path, name, s, &bytes)?;
    Ok(bytes)
}

/// [`read_section`] into a table the search reads at random rows (in huge
/// pages when it is large; see [`HugeBytes`]).
fn read_section_huge(dir: &Path, m: &Manifest, name: &str) -> Result<HugeBytes> {
    let s = m.section(&dir.join(crate::layout::format::MANIFEST_FILE), name)?;
    let path = dir.join(&s.file);
    let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
    if len != s.bytes {
        return Err(section_size_error(&path, name, len, s.bytes));
    }
    let len = usize::try_from(len).map_err(|_| {
        Error::corrupt(
            &path,
            format!("section {name:?} is too large for this machine"),
        )
    })?;
    let bytes = HugeBytes::read_from(file, len).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::corrupt(
                &path,
                format!("section {name:?} was truncated while it was read"),
            )
        } else {
            Error::io(&path, e)
        }
    })?;
    check_section(&path, name, s, &bytes)?;
    Ok(bytes)
}

fn section_size_error(path: &Path, name: &str, got: u64, want: u64) -> Error {
    Error::corrupt(
        path,
        format!(
            "section {name:?} has {got} bytes, the manifest says {want} (truncated or replaced)"
        ),
    )
}

/// Length and checksum of a section read whole.
fn check_section(
    path: &Path,
    name: &str,
    s: &crate::layout::format::SectionInfo,
    bytes: &[u8],
) -> Result<()> {
    if bytes.len() as u64 != s.bytes {
        return Err(section_size_error(path, name, bytes.len() as u64, s.bytes));
    }
    if let Some(crc) = s.crc32c {
        let got = crc32c::crc32c(bytes);
        if got != crc {
            return Err(Error::corrupt(path, format!("section {name:?} fails its CRC32C check (expected {crc:#010x}, got {got:#010x})")));
        }
    }
    Ok(())
}

/// Options for opening an index.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Search memory budget; `None` uses the budget the index was built with.
    /// What the PQ codes and maps leave of it holds the node cache.
    pub memory_budget: Option<Budget>,
    /// Cache exactly this many nodes instead (overrides the budget's share).
    pub cache_nodes: Option<usize>,
    /// Vectors of this many sampled nodes held in memory as entry points; each
    /// query starts from the nearest (`entry` "sampled", or "auto" on an index
    /// with neither a navigation graph nor centroid entries).
    pub entry_points: usize,
    /// Which entry points to use (see [`EntryKind`]).
    pub entry: EntryKind,
    /// List size of the navigation-graph search.
    pub nav_l: usize,
    /// Navigation-graph seeds per query (≤ `nav_l`).
    pub nav_seeds: usize,
    pub io: EngineKind,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            memory_budget: None,
            cache_nodes: None,
            entry_points: 0,
            entry: EntryKind::Auto,
            nav_l: DEFAULT_NAV_L,
            nav_seeds: DEFAULT_NAV_SEEDS,
            io: EngineKind::Auto,
        }
    }
}

impl OpenOptions {
    /// Checks the entry-point arguments.
    pub fn check(&self) -> Result<()> {
        if self.nav_l == 0 || self.nav_l > MAX_NAV_L {
            return Err(Error::arg(format!(
                "nav_L={} must be in 1..={MAX_NAV_L}",
                self.nav_l
            )));
        }
        if self.nav_seeds == 0 || self.nav_seeds > MAX_NAV_SEEDS {
            return Err(Error::arg(format!(
                "nav_seeds={} must be in 1..={MAX_NAV_SEEDS}",
                self.nav_seeds
            )));
        }
        if self.nav_seeds > self.nav_l {
            return Err(Error::arg(format!(
                "nav_seeds={} must not exceed nav_L={}",
                self.nav_seeds, self.nav_l
            )));
        }
        Ok(())
    }
}

struct Engine<T: Element> {
    data: IndexData<T>,
    workers: WorkerPool<T>,
}

enum AnyEngine {
    F32(Engine<f32>),
    F16(Engine<half::f16>),
    U8(Engine<u8>),
    I8(Engine<i8>),
}

macro_rules! with_engine {
    ($e:expr, $x:ident, $body:expr) => {
        match $e {
            AnyEngine::F32($x) => $body,
            AnyEngine::F16($x) => $body,
            AnyEngine::U8($x) => $body,
            AnyEngine::I8($x) => $body,
        }
    };
}

/// Where the resident memory of an open index goes, in bytes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MemoryAccount {
    pub pq_codes: u64,
    /// Sampled entry points (ids and vectors).
    pub entry_points: u64,
    /// The navigation graph (ids, vectors, adjacency).
    pub entry_nav: u64,
    /// Centroid entries (ids and vectors).
    pub entry_centroids: u64,
    pub pq_codebook: u64,
    pub cache: u64,
    pub ids: u64,
    /// A shuffled layout's node ↔ position maps.
    pub layout_map: u64,
    pub budget: u64,
    pub cache_nodes: u64,
}

impl MemoryAccount {
    /// Bytes the index holds resident (workers' scratch excluded).
    pub fn total(&self) -> u64 {
        self.pq_codes
            + self.pq_codebook
            + self.cache
            + self.ids
            + self.layout_map
            + self.entry_points
            + self.entry_nav
            + self.entry_centroids
    }
}

/// Search output: external ids (−1 pads), user-facing distances, statistics;
/// for a range search, `lims` (nq + 1 offsets into `ids`/`distances`).
#[derive(Debug, Default)]
pub struct SearchOutput {
    pub ids: Vec<i64>,
    pub distances: Vec<f32>,
    /// Range search only: query i's results are `lims[i]..lims[i + 1]`.
    pub lims: Vec<u64>,
    pub stats: Vec<QueryStats>,
}

/// Options of [`Index::range_search`] besides the radius.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeOptions {
    /// φ: the list doubles while the results within the radius fill at
    /// least this fraction of it.
    pub ratio: f32,
    /// Largest list size the doubling may reach (`None`:
    /// [`default_range_max_l`]).
    pub max_l: Option<usize>,
    /// `Some(c)`: end a query unread when its nearest entry point lies
    /// beyond `c · radius` (c ≥ 1).
    pub entry_cutoff: Option<f32>,
}

impl Default for RangeOptions {
    fn default() -> Self {
        RangeOptions {
            ratio: crate::search::DEFAULT_RANGE_RATIO,
            max_l: None,
            entry_cutoff: None,
        }
    }
}

/// Largest list a range search doubles to by default: 1024 × L (capped).
pub fn default_range_max_l(l: usize) -> usize {
    l.saturating_mul(1024)
        .clamp(l, crate::search::MAX_LIST_SIZE)
}

/// An open index; safe to share between threads.
pub struct Index {
    dir: PathBuf,
    manifest: Manifest,
    ids: Option<Vec<u64>>,
    engine: AnyEngine,
    memory: MemoryAccount,
    direct_io: bool,
    entry: EntryKind,
}

impl Index {
    /// Opens the index directory `dir`.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Index> {
        opts.check()?;
        let m = Manifest::read(dir)?;
        let entry = resolve_kind(
            opts.entry,
            m.sections.contains_key("nav_graph"),
            m.sections.contains_key("entry_centroids"),
            opts.entry_points,
        )?;
        let manifest_path = dir.join(crate::layout::format::MANIFEST_FILE);
        let geo = PageGeometry::new(
            m.layout.page_size,
            m.dim * m.dtype.size(),
            m.layout.max_degree,
            m.n,
        )
        .map_err(|e| Error::corrupt(&manifest_path, e.to_string()))?;
        let pages = m.section(&manifest_path, "pages")?;
        let pages_path = dir.join(&pages.file);
        let meta = std::fs::metadata(&pages_path).map_err(|e| Error::io(&pages_path, e))?;
        if meta.len() != geo.file_bytes() || pages.bytes != geo.file_bytes() {
            return Err(Error::corrupt(
                &pages_path,
                format!("page file has {} bytes, expected {} ({} blocks of {} bytes): truncated or replaced", meta.len(), geo.file_bytes(), geo.n_blocks, geo.block_size),
            ));
        }
        let cb_bytes = read_section(dir, &m, "pq_codebook")?;
        let codebook = PqCodebook::from_bytes(&dir.join("pq_codebook.bin"), &cb_bytes)?;
        drop(cb_bytes);
        if codebook.dim() != m.dim || codebook.m() != m.spec.pq_bytes {
            return Err(Error::corrupt(
                dir.join("pq_codebook.bin"),
                format!(
                    "codebook is {}-d with {} chunks; the manifest says {}-d with {} PQ bytes",
                    codebook.dim(),
                    codebook.m(),
                    m.dim,
                    m.spec.pq_bytes
                ),
            ));
        }
        let codes = read_section_huge(dir, &m, "pq_codes")?;
        if codes.len() != m.n * codebook.m() {
            return Err(Error::corrupt(
                dir.join("pq_codes.bin"),
                format!(
                    "{} bytes of codes, expected n × m = {}",
                    codes.len(),
                    m.n * codebook.m()
                ),
            ));
        }
        let ids = if m.sections.contains_key("ids") {
            let b = read_section(dir, &m, "ids")?;
            if b.len() != m.n * 8 {
                return Err(Error::corrupt(
                    dir.join("ids.bin"),
                    format!("{} bytes of ids, expected 8 × n = {}", b.len(), m.n * 8),
                ));
            }
            Some(
                b.chunks_exact(8)
                    .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect::<Vec<u64>>(),
            )
        } else {
            None
        };
        // Where records live: the ID layout, or a shuffled layout's map.
        let layout = match m.layout.kind.as_str() {
            "id" => AnyLayout::Id(IdLayout::new(geo, m.n)),
            "shuffled" => {
                let b = read_section(dir, &m, "id_to_location")?;
                let path = section_path(dir, &m, "id_to_location");
                AnyLayout::Shuffled(ShuffledLayout::from_bytes(&path, &b, geo, m.n)?)
            }
            other => {
                return Err(Error::Version {
                    path: manifest_path.clone(),
                    msg: format!(
                        "layout kind {other:?} is not one this reader knows (id, shuffled); upgrade nearline to open it"
                    ),
                })
            }
        };
        let raw = (m.n * m.dim * m.dtype.size()) as u64;
        let budget = opts
            .memory_budget
            .map(|b| b.resolve(raw))
            .unwrap_or(m.spec.memory_budget);
        let mut mem = MemoryAccount {
            pq_codes: codes.memory_bytes() as u64,
            pq_codebook: codebook_bytes(&codebook),
            ids: ids.as_ref().map(|v| v.capacity() as u64 * 8).unwrap_or(0),
            layout_map: layout.memory_bytes() as u64,
            budget,
            ..Default::default()
        };
        let esz = m.dtype.size();
        if entry == EntryKind::Sampled {
            mem.entry_points = (opts.entry_points.min(m.n) * (m.dim * esz + 4)) as u64;
        }
        let engine = with_dtype!(m.dtype, T, {
            // The entry points are loaded first: what they hold comes out of
            // the budget before the node cache is sized.
            let entries = match entry {
                EntryKind::Medoid | EntryKind::Auto => EntryPoints::Medoid(m.medoid),
                EntryKind::Sampled => {
                    let (ids, vecs) = crate::search::entry::load_sampled_entries::<T>(
                        &pages_path,
                        &layout,
                        m.n,
                        opts.entry_points,
                        m.spec.seed,
                    )?;
                    EntryPoints::Sampled {
                        medoid: m.medoid,
                        set: EntrySet {
                            dim: m.dim,
                            ids,
                            vecs,
                        },
                    }
                }
                EntryKind::Nav => {
                    let b = read_section(dir, &m, "nav_graph")?;
                    let path = section_path(dir, &m, "nav_graph");
                    let nav = NavGraph::<T>::from_bytes(&path, &b, m.dim, m.n)?;
                    mem.entry_nav = nav.memory_bytes() as u64;
                    EntryPoints::Nav {
                        medoid: m.medoid,
                        nav,
                        l: opts.nav_l,
                        seeds: opts.nav_seeds,
                    }
                }
                EntryKind::Centroids => {
                    let b = read_section(dir, &m, "entry_centroids")?;
                    let path = section_path(dir, &m, "entry_centroids");
                    let set = EntrySet::<T>::from_centroid_bytes(&path, &b, m.dim, m.n)?;
                    mem.entry_centroids = set.memory_bytes() as u64;
                    EntryPoints::Centroids {
                        medoid: m.medoid,
                        set,
                    }
                }
            };
            let cache_nodes = match opts.cache_nodes {
                Some(c) => c,
                None => NodeCache::capacity_for(&geo, budget.saturating_sub(mem.total())),
            };
            let cache = NodeCache::load_bfs(&pages_path, &layout, m.n, m.medoid, cache_nodes)?;
            mem.cache = cache.memory_bytes() as u64;
            mem.cache_nodes = cache.len() as u64;
            let (file, direct_io) = open_direct(&pages_path)?;
            let file = Arc::new(file);
            let data = IndexData::<T> {
                geo: *layout.geometry(),
                layout,
                scorer: AnyScorer::Pq(PqScorer {
                    codebook,
                    codes,
                    metric: m.metric,
                }),
                metric: m.metric,
                dim: m.dim,
                n: m.n,
                medoid: m.medoid,
                cache,
                pages_path: pages_path.clone(),
                file,
                io_kind: opts.io,
                entries,
                _elem: PhantomData,
            };
            (
                wrap(Engine {
                    data,
                    workers: WorkerPool::default(),
                }),
                direct_io,
            )
        });
        let (engine, direct_io) = engine;
        // Scratch of the load (BFS frontier, section buffers) is freed: give
        // it back so the resident set is what the index holds.
        crate::util::return_freed_memory();
        Ok(Index {
            dir: dir.to_path_buf(),
            manifest: m,
            ids,
            engine,
            memory: mem,
            direct_io,
            entry,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Memory accounting.
    pub fn memory(&self) -> &MemoryAccount {
        &self.memory
    }

    /// The beam / pipeline width a search uses when it gives none (the
    /// preset's: 4 for `diskann`, 32 for `pipeann`).
    pub fn default_width(&self) -> usize {
        crate::planner::preset_defaults(&self.manifest.spec.preset).width
    }

    /// Searches `nq` row-major float queries.
    pub fn search(
        &self,
        queries: &[f32],
        nq: usize,
        p: &SearchParams,
        threads: Option<usize>,
    ) -> Result<SearchOutput> {
        let threads = threads.unwrap_or_else(default_threads);
        if threads == 0 {
            return Err(Error::arg("threads must be at least 1"));
        }
        // `executor = auto` runs the preset's executor when it names one
        // (beam-only options keep the beam, as the layout rule does).
        let mut p = *p;
        let preset = crate::planner::preset_defaults(&self.manifest.spec.preset);
        if p.executor == ExecutorKind::Auto && !p.wants_beam_options() {
            p.executor = preset.executor;
        }
        let r: BatchResult = with_engine!(
            &self.engine,
            e,
            e.workers.search_batch(&e.data, queries, nq, &p, threads)
        )?;
        let metric = self.manifest.metric;
        let ids = r
            .ids
            .iter()
            .map(|&i| {
                if i == u32::MAX {
                    -1
                } else {
                    match &self.ids {
                        Some(ext) => ext[i as usize] as i64,
                        None => i as i64,
                    }
                }
            })
            .collect();
        let distances = r
            .distances
            .iter()
            .map(|&d| {
                if d.is_finite() {
                    metric.to_user(d)
                } else if metric.higher_is_closer() {
                    f32::NEG_INFINITY
                } else {
                    f32::INFINITY
                }
            })
            .collect();
        Ok(SearchOutput {
            ids,
            distances,
            lims: r.lims,
            stats: r.stats,
        })
    }

    /// Range search (Starling §5.3): every point within `radius` of each of
    /// `nq` row-major float queries — squared L2 distance ≤ radius, or
    /// inner-product / cosine score ≥ radius. The list starts at `p.l` and
    /// doubles while the results within the radius fill at least
    /// `o.ratio` of it (up to `o.max_l`, default [`default_range_max_l`]);
    /// kicked-out candidates come back when it grows. With
    /// `o.entry_cutoff = Some(c)`, a query whose nearest entry point lies
    /// beyond `c · radius` ends with no results and no reads (L2 and cosine;
    /// entry points with in-memory vectors). Works with every layout,
    /// executor and page policy; `p.k` is ignored. Results are sorted,
    /// closest first, in CSR form (`lims`).
    pub fn range_search(
        &self,
        queries: &[f32],
        nq: usize,
        radius: f32,
        o: &RangeOptions,
        p: &SearchParams,
        threads: Option<usize>,
    ) -> Result<SearchOutput> {
        let metric = self.manifest.metric;
        if !radius.is_finite() {
            return Err(Error::arg(format!("radius={radius} must be finite")));
        }
        if metric == Metric::L2 && radius < 0.0 {
            return Err(Error::arg(format!(
                "radius={radius} must be at least 0 (a squared L2 distance)"
            )));
        }
        if o.entry_cutoff.is_some() {
            if metric == Metric::InnerProduct {
                return Err(Error::arg(
                    "entry_cutoff needs a metric whose distances are not negative (l2 or \
                     cosine); inner-product scores have no scale to multiply",
                ));
            }
            if self.entry == EntryKind::Medoid {
                return Err(Error::arg(
                    "entry_cutoff needs entry points held in memory (entry \"nav\", \
                     \"sampled\" or \"centroids\"); this index starts every query from \
                     the medoid, whose distance is not known before a read",
                ));
            }
        }
        let internal = match metric {
            Metric::L2 => radius,
            Metric::InnerProduct => -radius,
            Metric::Cosine => 1.0 - radius,
        };
        let p = SearchParams {
            k: 1,
            range: Some(crate::search::RangeParams {
                radius: internal,
                ratio: o.ratio,
                max_l: o.max_l.unwrap_or_else(|| default_range_max_l(p.l)),
                entry_cutoff: o.entry_cutoff,
            }),
            ..*p
        };
        self.search(queries, nq, &p, threads)
    }

    /// The search data of a float32 index (tests drive workers directly).
    #[cfg(test)]
    pub(crate) fn data_f32(&self) -> Option<&IndexData<f32>> {
        match &self.engine {
            AnyEngine::F32(e) => Some(&e.data),
            _ => None,
        }
    }

    /// The entry-point kind in use.
    pub fn entry_kind(&self) -> EntryKind {
        self.entry
    }

    /// The entry points in use and those the index offers.
    fn entry_info(&self) -> serde_json::Value {
        let m = &self.manifest;
        let mut e = serde_json::json!({
            "kind": self.entry.name(),
            "has_nav": m.sections.contains_key("nav_graph"),
            "has_centroids": m.sections.contains_key("entry_centroids"),
            "nav_sample": m.spec.nav_sample,
            "entry_clusters": m.spec.entry_clusters,
        });
        let detail = with_engine!(
            &self.engine,
            x,
            match &x.data.entries {
                EntryPoints::Nav { nav, l, seeds, .. } => Some(serde_json::json!({
                    "nav_nodes": nav.len(), "nav_R": nav.r(), "nav_L": l, "nav_seeds": seeds,
                })),
                EntryPoints::Centroids { set, .. } =>
                    Some(serde_json::json!({"centroid_nodes": set.len()})),
                EntryPoints::Sampled { set, .. } =>
                    Some(serde_json::json!({"sampled_nodes": set.len()})),
                EntryPoints::Medoid(_) => None,
            }
        );
        if let (Some(serde_json::Value::Object(d)), Some(obj)) = (detail, e.as_object_mut()) {
            obj.extend(d);
        }
        e
    }

    /// A JSON description: sizes, memory accounting and the build spec.
    pub fn info(&self) -> serde_json::Value {
        let m = &self.manifest;
        let (engine_name, scratch) = with_engine!(
            &self.engine,
            e,
            (
                e.workers.engine_name(&e.data).unwrap_or("unavailable"),
                e.workers.memory_bytes()
            )
        );
        let mut files = serde_json::Map::new();
        let mut disk = 0u64;
        for (k, s) in &m.sections {
            files.insert(
                k.clone(),
                serde_json::json!({"file": s.file, "bytes": s.bytes, "crc32c": s.crc32c}),
            );
            disk += s.bytes;
        }
        serde_json::json!({
            "path": self.dir.display().to_string(),
            "format_version": format!("{}.{}", m.format_major, m.format_minor),
            "created_by": m.created_by,
            "preset": m.spec.preset,
            "n": m.n,
            "dim": m.dim,
            "dtype": m.dtype.name(),
            "metric": m.metric.name(),
            "medoid": m.medoid,
            "R": m.layout.max_degree,
            "pq_bytes": m.spec.pq_bytes,
            "layout": m.layout,
            "overlap_ratio": m.layout.overlap_ratio,
            "page_size": m.layout.page_size,
            "records_per_page": m.layout.records_per_block,
            "disk_bytes": disk,
            "sections": files,
            "memory": {
                "pq_codes": self.memory.pq_codes,
                "pq_codebook": self.memory.pq_codebook,
                "cache": self.memory.cache,
                "cache_nodes": self.memory.cache_nodes,
                "ids": self.memory.ids,
                "layout_map": self.memory.layout_map,
                "entry_points": self.memory.entry_points,
                "entry_nav": self.memory.entry_nav,
                "entry_centroids": self.memory.entry_centroids,
                "worker_scratch": scratch,
                "total": self.memory.total() + scratch as u64,
                "budget": self.memory.budget,
                "within_budget": self.memory.total() <= self.memory.budget,
            },
            "entry": self.entry_info(),
            "io_engine": engine_name,
            "direct_io": self.direct_io,
            "simd": crate::distance::kernels::simd_level(),
            "build": m.spec,
            "build_stats": m.build_stats,
            "wal_sequence": m.wal_sequence,
        })
    }
}

fn codebook_bytes(cb: &PqCodebook) -> u64 {
    (cb.dim() * crate::quant::pq::PQ_CENTROIDS * 4 + cb.dim() * 4 + (cb.m() + 1) * 4) as u64
}

trait Wrap {
    fn wrap(self) -> AnyEngine;
}
impl Wrap for Engine<f32> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::F32(self)
    }
}
impl Wrap for Engine<half::f16> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::F16(self)
    }
}
impl Wrap for Engine<u8> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::U8(self)
    }
}
impl Wrap for Engine<i8> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::I8(self)
    }
}
fn wrap<E: Wrap>(e: E) -> AnyEngine {
    e.wrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{FakeOptions, IoEngine};
    use crate::search::{search_one, Scratch};
    use rand::Rng;

    fn clustered(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let centers: Vec<f32> = (0..16 * dim).map(|_| rng.random_range(-8.0..8.0)).collect();
        let mut v = Vec::with_capacity(n * dim);
        for _ in 0..n {
            let c = rng.random_range(0..16);
            for j in 0..dim {
                v.push(centers[c * dim + j] + rng.random_range(-1.0f32..1.0));
            }
        }
        v
    }

    fn small_index(dir: &Path) -> (Index, Vec<f32>) {
        let data = clustered(2000, 16, 1);
        let m = Matrix::from_vec(data.clone(), 2000, 16).unwrap();
        let opts = BuildOptions {
            r: 16,
            build_l: 40,
            pq_bytes: Some(8),
            threads: Some(2),
            ..Default::default()
        };
        let never = AtomicBool::new(false);
        build(m, dir, &opts, &|_, _, _| {}, &never).unwrap();
        let idx = Index::open(
            dir,
            &OpenOptions {
                cache_nodes: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
        (idx, data)
    }

    fn engine_f32(idx: &Index) -> &Engine<f32> {
        match &idx.engine {
            AnyEngine::F32(e) => e,
            _ => panic!("expected a float32 index"),
        }
    }

    #[test]
    fn out_of_order_delayed_completions_give_the_same_results() {
        let tmp = tempfile::tempdir().unwrap();
        let (idx, _) = small_index(&tmp.path().join("i"));
        let e = engine_f32(&idx);
        let pages = Arc::new(std::fs::read(&e.data.pages_path).unwrap());
        let queries = clustered(30, 16, 9);
        let p = SearchParams::new(10, 60, 8);
        let mut real = Scratch::new(&e.data).unwrap();
        for seed in 0..4 {
            let fake = IoEngine::fake(
                pages.clone(),
                FakeOptions {
                    seed,
                    max_delay_polls: 3,
                    ..Default::default()
                },
            );
            let mut s = Scratch::with_engine(&e.data, fake);
            for q in queries.chunks_exact(16) {
                let (mut a, mut b) = (QueryStats::default(), QueryStats::default());
                search_one(&e.data, &mut real, q, &p, &mut a).unwrap();
                search_one(&e.data, &mut s, q, &p, &mut b).unwrap();
                assert_eq!(real.results, s.results);
                assert_eq!(a.reads, b.reads);
                assert_eq!(s.in_flight(), 0);
            }
        }
    }

    #[test]
    fn failed_reads_are_errors_and_leave_nothing_in_flight() {
        let tmp = tempfile::tempdir().unwrap();
        let (idx, _) = small_index(&tmp.path().join("i"));
        let e = engine_f32(&idx);
        let pages = Arc::new(std::fs::read(&e.data.pages_path).unwrap());
        let fake = IoEngine::fake(
            pages.clone(),
            FakeOptions {
                seed: 1,
                max_delay_polls: 2,
                fail_probability: 0.2,
                ..Default::default()
            },
        );
        let mut s = Scratch::with_engine(&e.data, fake);
        let p = SearchParams::new(10, 60, 8);
        let mut errors = 0;
        for q in clustered(20, 16, 4).chunks_exact(16) {
            let mut st = QueryStats::default();
            if search_one(&e.data, &mut s, q, &p, &mut st).is_err() {
                errors += 1;
            }
            assert_eq!(s.in_flight(), 0, "a failed query must drain its reads");
        }
        assert!(errors > 0);
        // A truncated "file": reads past its end are short and must be refused.
        let short = Arc::new(pages[..pages.len() / 2].to_vec());
        let mut s = Scratch::with_engine(&e.data, IoEngine::fake(short, FakeOptions::default()));
        let mut failed = false;
        for q in clustered(20, 16, 5).chunks_exact(16) {
            let mut st = QueryStats::default();
            if let Err(err) = search_one(&e.data, &mut s, q, &p, &mut st) {
                assert!(err.to_string().contains("truncated"), "{err}");
                failed = true;
            }
        }
        assert!(failed);
    }

    #[test]
    fn build_is_deterministic_for_a_seed() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, _) = small_index(&tmp.path().join("a"));
        let (b, _) = small_index(&tmp.path().join("b"));
        let pa = std::fs::read(tmp.path().join("a/pages.bin")).unwrap();
        let pb = std::fs::read(tmp.path().join("b/pages.bin")).unwrap();
        assert!(
            pa == pb,
            "same seed and threads must give the same page file"
        );
        assert_eq!(a.manifest().medoid, b.manifest().medoid);
    }

    #[test]
    fn cancelled_build_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c");
        let m = Matrix::from_vec(clustered(500, 8, 2), 500, 8).unwrap();
        let cancel = AtomicBool::new(true);
        let r = build(
            m,
            &dir,
            &BuildOptions {
                r: 8,
                build_l: 16,
                pq_bytes: Some(4),
                ..Default::default()
            },
            &|_, _, _| {},
            &cancel,
        );
        assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn saturation_fills_lists_towards_r() {
        let tmp = tempfile::tempdir().unwrap();
        let never = AtomicBool::new(false);
        let mut degrees = Vec::new();
        for saturate in [false, true] {
            let m = Matrix::from_vec(clustered(2000, 16, 1), 2000, 16).unwrap();
            let opts = BuildOptions {
                r: 16,
                build_l: 40,
                pq_bytes: Some(8),
                threads: Some(2),
                saturate,
                ..Default::default()
            };
            let man = build(
                m,
                &tmp.path().join(format!("s{saturate}")),
                &opts,
                &|_, _, _| {},
                &never,
            )
            .unwrap();
            assert_eq!(man.spec.saturate, saturate);
            degrees.push(man.build_stats.mean_degree);
        }
        assert!(degrees[1] > degrees[0], "{degrees:?}");
        assert!(degrees[1] >= 0.9 * 16.0, "{degrees:?}");
    }

    fn entry_index(dir: &Path, nav_sample: f64, entry_clusters: usize) -> Vec<f32> {
        let data = clustered(2000, 16, 1);
        let m = Matrix::from_vec(data.clone(), 2000, 16).unwrap();
        let opts = BuildOptions {
            r: 16,
            build_l: 40,
            pq_bytes: Some(8),
            threads: Some(2),
            nav_sample,
            entry_clusters,
            ..Default::default()
        };
        let never = AtomicBool::new(false);
        let man = build(m, dir, &opts, &|_, _, _| {}, &never).unwrap();
        assert_eq!(man.spec.nav_sample, nav_sample);
        assert_eq!(man.spec.entry_clusters, entry_clusters);
        assert_eq!(man.sections.contains_key("nav_graph"), nav_sample > 0.0);
        assert_eq!(
            man.sections.contains_key("entry_centroids"),
            entry_clusters > 0
        );
        data
    }

    fn open_entry(dir: &Path, entry: EntryKind) -> Result<Index> {
        Index::open(
            dir,
            &OpenOptions {
                entry,
                entry_points: if entry == EntryKind::Sampled { 64 } else { 0 },
                cache_nodes: Some(0),
                ..Default::default()
            },
        )
    }

    #[test]
    fn every_entry_kind_is_exact_at_full_list_size() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("e");
        let data = entry_index(&dir, 0.02, 30);
        let queries = clustered(20, 16, 77);
        let k = 10;
        let exact: Vec<u32> = queries
            .chunks_exact(16)
            .flat_map(|q| {
                crate::graph::vamana::tests::brute_topk(2000, k, |i| {
                    Metric::L2.distance(q, &data[i as usize * 16..(i as usize + 1) * 16])
                })
            })
            .collect();
        let p = SearchParams::new(k, 2000, 8);
        for kind in [
            EntryKind::Auto,
            EntryKind::Medoid,
            EntryKind::Sampled,
            EntryKind::Nav,
            EntryKind::Centroids,
        ] {
            let idx = open_entry(&dir, kind).unwrap();
            let want = if kind == EntryKind::Auto {
                EntryKind::Nav
            } else {
                kind
            };
            assert_eq!(idx.entry_kind(), want);
            assert_eq!(idx.info()["entry"]["kind"], want.name());
            let out = idx.search(&queries, 20, &p, Some(2)).unwrap();
            let got: Vec<u32> = out.ids.iter().map(|&i| i as u32).collect();
            assert_eq!(got, exact, "entry {kind}");
        }
    }

    #[test]
    fn entry_structures_are_counted_in_the_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        entry_index(&dir, 0.05, 40);
        let budget = 200_000u64;
        let open = |entry| {
            Index::open(
                &dir,
                &OpenOptions {
                    entry,
                    memory_budget: Some(Budget::Bytes(budget)),
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let plain = open(EntryKind::Medoid);
        let nav = open(EntryKind::Nav);
        let cen = open(EntryKind::Centroids);
        let (pm, nm, cm) = (plain.memory(), nav.memory(), cen.memory());
        assert_eq!((pm.entry_nav, pm.entry_centroids), (0, 0));
        // 100 sample nodes: ids, 16-d f32 vectors and R = 32 adjacency.
        assert!(nm.entry_nav >= 100 * (4 + 64 + 4 * 32), "{nm:?}");
        assert_eq!(nm.entry_centroids, 0);
        assert!(cm.entry_centroids >= 40 * (4 + 64), "{cm:?}");
        for m in [pm, nm, cm] {
            assert!(m.total() <= budget, "{m:?}");
        }
        // What the entry points hold comes out of the node cache.
        assert!(nm.cache_nodes < pm.cache_nodes, "{nm:?} vs {pm:?}");
        assert!(cm.cache_nodes < pm.cache_nodes, "{cm:?} vs {pm:?}");
        // The node cache never overshoots what the budget leaves it (its id
        // map grows in powers of two).
        for b in [60_000u64, 91_000, 140_001, 233_333, 420_000] {
            for entry in [EntryKind::Medoid, EntryKind::Nav] {
                let idx = Index::open(
                    &dir,
                    &OpenOptions {
                        entry,
                        memory_budget: Some(Budget::Bytes(b)),
                        ..Default::default()
                    },
                )
                .unwrap();
                assert!(idx.memory().total() <= b, "{b}: {:?}", idx.memory());
            }
        }
        let info = nav.info();
        assert_eq!(info["memory"]["entry_nav"], nm.entry_nav);
        assert_eq!(info["entry"]["nav_nodes"], 100);
        assert_eq!(info["entry"]["nav_L"], DEFAULT_NAV_L);
        assert_eq!(info["entry"]["nav_seeds"], DEFAULT_NAV_SEEDS);
        assert_eq!(info["build"]["nav_sample"], 0.05);
        assert_eq!(info["build"]["entry_clusters"], 40);
    }

    #[test]
    fn nav_sections_are_deterministic_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        entry_index(&a, 0.03, 20);
        entry_index(&b, 0.03, 20);
        for f in ["nav_graph.bin", "entry_centroids.bin"] {
            assert!(
                std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
                "{f}: same seed, same section"
            );
        }
        // A flipped byte fails the manifest checksum.
        let mut nav = std::fs::read(a.join("nav_graph.bin")).unwrap();
        nav[40] ^= 1;
        std::fs::write(a.join("nav_graph.bin"), &nav).unwrap();
        let e = open_entry(&a, EntryKind::Nav).err().unwrap();
        assert!(
            matches!(e, Error::Corrupt { .. }) && e.to_string().contains("CRC32C"),
            "{e}"
        );
        // Other entry kinds do not read the section.
        open_entry(&a, EntryKind::Medoid).unwrap();
        // A truncated section, with the manifest's size and checksum made to
        // agree, fails the structural check.
        nav[40] ^= 1;
        let cut = &nav[..nav.len() - 10];
        std::fs::write(a.join("nav_graph.bin"), cut).unwrap();
        let e = open_entry(&a, EntryKind::Nav).err().unwrap();
        assert!(e.to_string().contains("truncated"), "{e}");
        let mut man = Manifest::read(&a).unwrap();
        let s = man.sections.get_mut("nav_graph").unwrap();
        s.bytes = cut.len() as u64;
        s.crc32c = Some(crc32c::crc32c(cut));
        man.write(&a).unwrap();
        let e = open_entry(&a, EntryKind::Nav).err().unwrap();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("navigation graph"), "{e}");
        // Centroid section damage.
        let mut c = std::fs::read(b.join("entry_centroids.bin")).unwrap();
        c[30] ^= 4;
        std::fs::write(b.join("entry_centroids.bin"), &c).unwrap();
        let e = open_entry(&b, EntryKind::Centroids).err().unwrap();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        // A missing section file is an I/O error naming it.
        std::fs::remove_file(b.join("nav_graph.bin")).unwrap();
        let e = open_entry(&b, EntryKind::Auto).err().unwrap();
        assert!(e.to_string().contains("nav_graph.bin"), "{e}");
    }

    #[test]
    fn entry_arguments_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let never = AtomicBool::new(false);
        for (nav_sample, entry_clusters, needle) in [
            (-0.1, 0, "nav_sample"),
            (0.9, 0, "nav_sample"),
            (f64::NAN, 0, "nav_sample"),
            (0.0, 101, "entry_clusters"),
        ] {
            let m = Matrix::from_vec(clustered(100, 4, 3), 100, 4).unwrap();
            let opts = BuildOptions {
                nav_sample,
                entry_clusters,
                pq_bytes: Some(2),
                ..Default::default()
            };
            let e = build(m, &tmp.path().join("x"), &opts, &|_, _, _| {}, &never).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        }
        let dir = tmp.path().join("plain");
        entry_index(&dir, 0.0, 0);
        let e = open_entry(&dir, EntryKind::Nav).err().unwrap();
        assert!(e.to_string().contains("nav_sample"), "{e}");
        let e = open_entry(&dir, EntryKind::Centroids).err().unwrap();
        assert!(e.to_string().contains("entry_clusters"), "{e}");
        assert_eq!(
            open_entry(&dir, EntryKind::Auto).unwrap().entry_kind(),
            EntryKind::Medoid
        );
        for (l, s) in [(0, 1), (8, 0), (8, 9), (MAX_NAV_L + 1, 4)] {
            let e = Index::open(
                &dir,
                &OpenOptions {
                    nav_l: l,
                    nav_seeds: s,
                    ..Default::default()
                },
            )
            .err()
            .unwrap();
            assert!(e.to_string().contains("nav_"), "{e}");
        }
    }

    #[test]
    fn older_manifests_without_entry_fields_still_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("old");
        entry_index(&dir, 0.0, 0);
        let path = dir.join(crate::layout::format::MANIFEST_FILE);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["format_minor"] = 0.into();
        let spec = v["spec"].as_object_mut().unwrap();
        spec.remove("nav_sample");
        spec.remove("entry_clusters");
        v["build_stats"]
            .as_object_mut()
            .unwrap()
            .remove("entry_seconds");
        std::fs::write(&path, v.to_string()).unwrap();
        let idx = open_entry(&dir, EntryKind::Auto).unwrap();
        assert_eq!(idx.manifest().spec.nav_sample, 0.0);
        assert_eq!(idx.manifest().spec.entry_clusters, 0);
        assert_eq!(idx.entry_kind(), EntryKind::Medoid);
    }

    #[test]
    fn pq_bytes_follow_diskann_rule() {
        assert_eq!(pq_bytes_for_budget(1_000_000, 128, 32_000_000), 32);
        assert_eq!(pq_bytes_for_budget(1_000_000, 128, 1), 1);
        assert_eq!(pq_bytes_for_budget(10, 2048, u64::MAX), 512);
        assert_eq!(pq_bytes_for_budget(10, 64, u64::MAX), 64);
    }
}
