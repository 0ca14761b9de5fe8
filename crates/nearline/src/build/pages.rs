//! Build phase 3: the placement (ID layout, Starling's block shuffling,
//! PageANN's page graph, or Gorgeous' graph replication), the page file,
//! the location map and the adjacency section.

use super::{check_cancel, BuildPlan, Progress, SectionEntry};
use crate::data::matrix::Matrix;
use crate::elem::Element;
use crate::format::{
    PageGeometry, PageGraphInfo, Placement, RecordFormat, ReplicationInfo, Section, SectionInfo,
    ShuffleInfo,
};
use crate::graph::Graph;
use crate::io::files::{sync_file, write_section, write_section_with};
use crate::layout::shuffle::{overlap_ratio, shuffle_blocks, ShuffleParams};
use crate::layout::writer::{write_pages, RecordCoder};
use crate::layout::{page_graph, replicate};
use crate::layout::{AnyLayout, IdLayout, Layout, ShuffledLayout};
use crate::quant::rabitq::RaBitQ;
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// What the phase made.
pub struct Placed {
    pub geo: PageGeometry,
    /// OR(G) of the layout.
    pub overlap_ratio: f64,
    /// How a shuffled layout was made.
    pub shuffle: Option<ShuffleInfo>,
    /// How a replicated layout spread the lists.
    pub replication: Option<ReplicationInfo>,
    /// How a page graph's edges were chosen.
    pub page_graph: Option<PageGraphInfo>,
    /// The page file and the location map.
    pub sections: Vec<SectionEntry>,
}

/// What a coded layout's records are coded with.
#[derive(Clone, Copy, Default)]
pub struct RecordCodes<'a> {
    /// A coded layout's (AlayaLaser) RaBitQ rotation of its transform.
    pub rabitq: Option<&'a RaBitQ>,
    /// A PQ-coded layout's (AiSAQ) `n × m` PQ codes of every node, and m.
    pub pq: Option<(&'a [u8], usize)>,
}

/// Places the nodes of `graph`, writes the page file, the location map and
/// (when planned) the adjacency section into `dir`.
#[allow(clippy::too_many_arguments)]
pub fn run<T: Element>(
    data: &Matrix<T>,
    graph: &Graph,
    medoid: u32,
    plan: &BuildPlan,
    codes: RecordCodes<'_>,
    dir: &Path,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Placed> {
    let n = data.n();
    let vec_bytes = data.dim() * T::DTYPE.size();
    let pq_coded = plan.layout.records() == RecordFormat::PqCoded;
    let geo = if pq_coded {
        let (c, m) = codes
            .pq
            .ok_or_else(|| Error::arg("a PQ-coded layout is written with the nodes' PQ codes"))?;
        if Some(c.len()) != n.checked_mul(m) {
            return Err(Error::arg(format!(
                "{} bytes of PQ codes for {n} nodes of {m} bytes each",
                c.len()
            )));
        }
        PageGeometry::with_pq_codes(plan.page_size, vec_bytes, plan.r, m, n)?
    } else if plan.layout.records() == RecordFormat::Decoupled {
        PageGeometry::decoupled(plan.page_size, vec_bytes, plan.r, n)?
    } else if plan.layout.placement() == Placement::PageGraph {
        // A page's records share its out-edges: at least R of them.
        PageGeometry::page_graph(plan.page_size, vec_bytes, plan.r, n)?
    } else {
        PageGeometry::with_regions(
            plan.page_size,
            vec_bytes,
            plan.r,
            plan.packed,
            plan.code_dims,
            plan.code_bits,
            n,
        )?
    };
    let rabitq = codes.rabitq;
    let rpb = geo.records_per_block;
    let mut packing = None;
    // What the records carry: a replicated layout chooses the lists each
    // record packs (from its ID-order neighbours).
    if plan.layout.records() == RecordFormat::Replicated {
        progress("replicate", 0, 1);
        packing = Some(replicate::choose(
            data,
            graph,
            plan.metric,
            plan.packed,
            plan.replica_cap,
            cancel,
        )?);
        progress("replicate", 1, 1);
    }
    // Where they go.
    let (layout, shuffle, or_g) = match plan.layout.placement() {
        Placement::Id => {
            let ids: Vec<u32> = (0..n as u32).collect();
            let or_g = overlap_ratio(graph, rpb, &ids);
            (AnyLayout::Id(IdLayout::new(geo, n)), None, or_g)
        }
        placement @ (Placement::Shuffled | Placement::PageGraph) => {
            progress("shuffle", 0, 1);
            let ts = Instant::now();
            let sp = ShuffleParams {
                seed: plan.seed,
                ..plan.shuffle.clone()
            };
            let sh = shuffle_blocks(graph, rpb, &sp, cancel)?;
            let info = ShuffleInfo {
                algorithm: sp.algo.name().into(),
                bnf_iters: sp.bnf_iters,
                bnf_tau: sp.bnf_tau,
                bns_iters: sp.bns_iters,
                iterations: sh.iterations,
                id_overlap_ratio: sh.id_overlap_ratio,
                seconds: ts.elapsed().as_secs_f64(),
            };
            let l = ShuffledLayout::placed(geo, sh.loc, placement).map_err(|m| {
                Error::Engine(format!(
                    "block shuffling produced an invalid placement: {m}"
                ))
            })?;
            progress("shuffle", 1, 1);
            (AnyLayout::Shuffled(l), Some(info), sh.overlap_ratio)
        }
    };
    check_cancel(cancel)?;
    // A page graph: the records hold their pages' edges, not their own.
    let page_edges = match (&layout, plan.layout.placement()) {
        (AnyLayout::Shuffled(l), Placement::PageGraph) => {
            progress("page_graph", 0, 1);
            let pe = page_graph::build(data, graph, plan.metric, l, medoid, cancel)?;
            progress("page_graph", 1, 1);
            Some(pe)
        }
        _ => None,
    };
    let graph = page_edges.as_ref().map_or(graph, |p| &p.graph);
    check_cancel(cancel)?;
    progress("layout", 0, geo.n_blocks);
    let pages = dir.join("pages.bin");
    // A coded layout's records carry their neighbours' codes, made from
    // the (transformed, float32) rows.
    let coder = match (plan.code_dims > 0, rabitq) {
        (false, _) => None,
        (true, Some(q)) => {
            let rows: &[f32] = bytemuck::try_cast_slice(data.as_slice())
                .map_err(|_| Error::arg("a coded layout is written from float32 vectors"))?;
            Some((q, rows))
        }
        (true, None) => {
            return Err(Error::arg(
                "a coded layout needs the RaBitQ rotation of its transform",
            ))
        }
    };
    let dim = data.dim();
    let pq = codes.pq.filter(|_| pq_coded);
    let code = |v: u32, rec: &mut [u8]| -> Result<()> {
        if let Some((all, m)) = pq {
            // The list as the record stores it (at most R).
            let list = graph.neighbors(v);
            let list = &list[..list.len().min(geo.max_degree)];
            let slots = list
                .iter()
                .map(|&u| {
                    let at = u as usize * m;
                    all.get(at..at + m).ok_or_else(|| {
                        Error::arg(format!("node {v} lists {u}, which has no PQ code"))
                    })
                })
                .collect::<Result<Vec<&[u8]>>>()?;
            let written = geo.write_pq_codes(rec, slots.into_iter());
            return written.map_err(|e| Error::Engine(format!("record of node {v}: {e}")));
        }
        match coder {
            Some((q, rows)) => {
                let at = v as usize * dim;
                let centre = rows
                    .get(at..at + dim)
                    .ok_or_else(|| Error::arg(format!("node {v} is not a row of the data")))?;
                super::codes::write_region(&geo, q, rows, dim, centre, graph.neighbors(v), rec)
            }
            None => Ok(()),
        }
    };
    let coded = coder.is_some() || pq.is_some();
    write_pages(
        &pages,
        &layout,
        data,
        graph,
        packing.as_ref(),
        coded.then_some(&code as RecordCoder<'_>),
        cancel,
    )?;
    sync_file(&pages)?;
    if let Some(d) = plan.disk_budget {
        if geo.file_bytes() > d {
            return Err(Error::Engine(format!(
                "the page file takes {} bytes, above disk_budget={d} (the planner's geometry \
                 was wrong)",
                geo.file_bytes()
            )));
        }
    }
    let replication = packing.as_ref().map(|p| {
        let plain = PageGeometry::new(plan.page_size, vec_bytes, plan.r, n)
            .map(|g| g.file_bytes())
            .unwrap_or(0);
        p.stats(n, plain)
    });
    drop(packing);
    progress("layout", geo.n_blocks, geo.n_blocks);
    let mut sections = vec![(
        Section::Pages,
        SectionInfo {
            file: "pages.bin".into(),
            kind: "pages".into(),
            bytes: geo.file_bytes(),
            crc32c: None,
        },
    )];
    let location = match &layout {
        AnyLayout::Id(_) => SectionInfo {
            file: String::new(),
            kind: "identity".into(),
            bytes: 0,
            crc32c: None,
        },
        AnyLayout::Shuffled(l) => write_section(
            dir,
            "id_to_location.bin",
            "block_map",
            &crate::format::location::encode(l.geometry(), l.positions()),
        )?,
    };
    sections.push((Section::IdToLocation, location));
    if plan.in_degree {
        check_cancel(cancel)?;
        let limit = (crate::format::in_degree::IN_DEGREE_STORED_SHARE * n as f64).ceil() as usize;
        let order = crate::format::in_degree::order(
            n,
            (0..n as u32).map(|v| {
                let l = graph.neighbors(v);
                &l[..l.len().min(plan.r)]
            }),
            limit,
        );
        sections.push((
            Section::InDegree,
            write_section(
                dir,
                "in_degree.bin",
                "in_degree",
                &crate::format::in_degree::encode(n, &order),
            )?,
        ));
    }
    if plan.adjacency {
        check_cancel(cancel)?;
        progress("adjacency", 0, 1);
        // Priority: breadth-first from the navigation graph's nodes (what
        // a search enters through) and the medoid.
        let mut seeds = crate::graph::nav::sample_ids(n, plan.nav_sample, plan.seed);
        seeds.push(medoid);
        let order = graph.bfs_order(&seeds);
        drop(seeds);
        let info = write_section_with(dir, "adjacency.bin", "adjacency", |w| {
            crate::format::adjacency::write(w, n, plan.r, &order, |v| {
                let l = graph.neighbors(v);
                &l[..l.len().min(plan.r)]
            })
        })?;
        sections.push((Section::Adjacency, info));
        progress("adjacency", 1, 1);
    }
    Ok(Placed {
        geo: *layout.geometry(),
        overlap_ratio: or_g,
        shuffle,
        replication,
        page_graph: page_edges.map(|p| p.info),
        sections,
    })
}
