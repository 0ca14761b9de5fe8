//! PageANN's page graph: the graph's nodes are pages.
//!
//! The records are first grouped into pages by proximity (Starling's block
//! shuffling over the node graph, whose edges join near vectors). A page
//! is then read and expanded as one node: every record gets an exact
//! distance and the page's out-edges are scored, so what a page needs is
//! one list of edges to *other pages*, not one list per record. Those
//! edges are chosen here from the node graph's:
//!
//! 1. every edge u → w of a member u that leaves the page is a candidate
//!    edge to w's page, through w; a page reached by several candidates
//!    keeps the shortest (its distance `d(u, w)`);
//! 2. the page keeps its nearest candidate pages, as many as its records'
//!    lists hold (`records × R'`, the geometry's page degree);
//! 3. a page with room left takes back-edges from the pages that lead to
//!    it (Vamana's reverse edges, at page level), so a page is not only
//!    entered but left towards where the search came from;
//! 4. a page the start node's page cannot reach gets an edge from a page
//!    that can, one whose node-graph edges lead into it (replacing that
//!    page's farthest edge when it is full, never the only edge into a
//!    page), until every page is reachable.
//!
//! The edges are then spread over the page's records (an edge goes to the
//! record of the member it came from while that record has room), so the
//! page file keeps the plain record format: a search that expands every
//! record of a page (block search at σ = 1) expands the page's edges. Each
//! edge names one node of the target page, through which it is scored.

use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::elem::Element;
use crate::format::PageGraphInfo;
use crate::graph::Graph;
use crate::layout::Layout;
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Pages whose edges are chosen per chunk of work (bounded so cancellation
/// is prompt).
const CHUNK: usize = 4096;

/// One edge of a page: the member whose record holds it and the node of
/// the other page it leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Edge {
    holder: u32,
    target: u32,
}

/// The page graph: the node lists the records store, and how they were
/// chosen.
pub struct PageEdges {
    /// Each node's share of its page's out-edges (at most the geometry's
    /// record degree).
    pub graph: Graph,
    pub info: PageGraphInfo,
}

fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// Chooses the page graph of the nodes of `graph` placed by `layout` (see
/// the module docs); `start` is the node every search can begin from.
pub fn build<T: Element, L: Layout>(
    data: &Matrix<T>,
    graph: &Graph,
    metric: Metric,
    layout: &L,
    start: u32,
    cancel: &AtomicBool,
) -> Result<PageEdges> {
    let t0 = Instant::now();
    let n = graph.n();
    if data.n() != n {
        return Err(Error::arg(format!(
            "page graph: {} vectors for a graph of {n} nodes",
            data.n()
        )));
    }
    let geo = *layout.geometry();
    let per_record = geo.max_degree;
    let pages = geo.n_blocks as usize;
    let mut members: Vec<Vec<u32>> = Vec::with_capacity(pages);
    let mut page_of = vec![u32::MAX; n];
    for b in 0..pages {
        let mut m = Vec::new();
        layout.block_nodes(b as u64, &mut m);
        for &v in &m {
            let slot = page_of.get_mut(v as usize).ok_or_else(|| {
                Error::Engine(format!("page graph: page {b} holds node {v} of {n}"))
            })?;
            *slot = b as u32;
        }
        members.push(m);
    }
    if let Some(v) = page_of.iter().position(|&p| p == u32::MAX) {
        return Err(Error::Engine(format!("page graph: node {v} is on no page")));
    }
    let capacity = |p: usize| members[p].len() * per_record;

    // 1–2. Each page's nearest candidate pages.
    let mut edges: Vec<Vec<Edge>> = Vec::with_capacity(pages);
    let mut candidates = 0u64;
    for c in (0..pages).step_by(CHUNK) {
        check_cancel(cancel)?;
        let chunk: Vec<(Vec<Edge>, usize)> = (c..(c + CHUNK).min(pages))
            .into_par_iter()
            .map(|p| {
                let mut cand: Vec<(u32, f32, Edge)> = Vec::new();
                for &u in &members[p] {
                    let row = data.row(u as usize);
                    for &w in graph.neighbors(u) {
                        let q = match page_of.get(w as usize) {
                            Some(&q) if q as usize != p => q,
                            _ => continue,
                        };
                        let d = metric.distance(row, data.row(w as usize));
                        cand.push((
                            q,
                            d,
                            Edge {
                                holder: u,
                                target: w,
                            },
                        ));
                    }
                }
                // The shortest candidate into each page, then the nearest pages.
                cand.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
                cand.dedup_by_key(|c| c.0);
                let distinct = cand.len();
                cand.sort_unstable_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                cand.truncate(capacity(p));
                (cand.into_iter().map(|c| c.2).collect(), distinct)
            })
            .collect();
        for (e, d) in chunk {
            candidates += d as u64;
            edges.push(e);
        }
    }

    // Target pages per page, kept sorted for membership tests.
    let mut targets: Vec<Vec<u32>> = edges
        .iter()
        .map(|es| {
            let mut t: Vec<u32> = es.iter().map(|e| page_of[e.target as usize]).collect();
            t.sort_unstable();
            t
        })
        .collect();
    let add_target = |targets: &mut Vec<Vec<u32>>, p: usize, q: u32| {
        if let Err(i) = targets[p].binary_search(&q) {
            targets[p].insert(i, q);
        }
    };

    // 3. Back-edges into pages with room.
    check_cancel(cancel)?;
    let mut back_edges = 0u64;
    for p in 0..pages {
        for i in 0..edges[p].len() {
            let e = edges[p][i];
            let q = page_of[e.target as usize] as usize;
            if edges[q].len() < capacity(q) && targets[q].binary_search(&(p as u32)).is_err() {
                edges[q].push(Edge {
                    holder: e.target,
                    target: e.holder,
                });
                add_target(&mut targets, q, p as u32);
                back_edges += 1;
            }
        }
    }

    // 4. Every page reachable from the start's page.
    let start_page = *page_of
        .get(start as usize)
        .ok_or_else(|| Error::arg(format!("page graph: start node {start} of {n}")))?
        as usize;
    // The edges of a depth-first tree that reaches the pages reached so
    // far are kept: replacing any other edge disconnects no reached page,
    // so every repair reaches at least one more page. (Depth first, a
    // page's tree edges are few, which leaves most pages edges to give.)
    let mut kept: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
    let mut reached = vec![false; pages];
    let mut repairs = 0u64;
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut roots = vec![start_page];
    loop {
        check_cancel(cancel)?;
        for r in roots.drain(..) {
            reached[r] = true;
            stack.push((r, 0));
            while let Some((p, i)) = stack.pop() {
                let Some(&q) = targets[p].get(i) else {
                    continue;
                };
                stack.push((p, i + 1));
                if !reached[q as usize] {
                    reached[q as usize] = true;
                    kept.insert((p as u32, q));
                    stack.push((q as usize, 0));
                }
            }
        }
        if reached.iter().all(|&r| r) {
            break;
        }
        // A node-graph edge from a reached page into an unreached one,
        // from a page with room or an edge off the tree.
        let mut added = false;
        for u in 0..n as u32 {
            let p = page_of[u as usize] as usize;
            if !reached[p] {
                continue;
            }
            let Some(&w) = graph.neighbors(u).iter().find(|&&w| {
                page_of
                    .get(w as usize)
                    .is_some_and(|&q| !reached[q as usize])
            }) else {
                continue;
            };
            let q = page_of[w as usize];
            if edges[p].len() >= capacity(p) {
                // The farthest edge off the tree.
                let Some(i) = (0..edges[p].len())
                    .rev()
                    .find(|&i| !kept.contains(&(p as u32, page_of[edges[p][i].target as usize])))
                else {
                    continue;
                };
                let old = page_of[edges[p][i].target as usize];
                if let Ok(k) = targets[p].binary_search(&old) {
                    targets[p].remove(k);
                }
                edges[p].remove(i);
            }
            edges[p].push(Edge {
                holder: u,
                target: w,
            });
            add_target(&mut targets, p, q);
            kept.insert((p as u32, q));
            repairs += 1;
            roots.push(q as usize);
            added = true;
            break;
        }
        if !added {
            // No reached page can take an edge into the rest (the node
            // graph does not lead there, or every such page's edges are
            // the tree's): `check` reports what stays unreachable.
            break;
        }
    }

    // The edges onto the records: each to its holder while it has room.
    let mut out = Graph::new(n, per_record);
    let mut lists: Vec<Vec<u32>> = Vec::new();
    let mut spill: Vec<u32> = Vec::new();
    let mut degrees = Vec::with_capacity(pages);
    for p in 0..pages {
        let m = &members[p];
        lists.clear();
        lists.resize(m.len(), Vec::new());
        spill.clear();
        for e in &edges[p] {
            match m.iter().position(|&v| v == e.holder) {
                Some(i) if lists[i].len() < per_record => lists[i].push(e.target),
                _ => spill.push(e.target),
            }
        }
        for t in spill.drain(..) {
            if let Some(l) = lists.iter_mut().find(|l| l.len() < per_record) {
                l.push(t);
            }
        }
        let mut degree = 0usize;
        for (i, l) in lists.iter().enumerate() {
            out.set_neighbors(m[i], l);
            degree += l.len();
        }
        degrees.push(degree);
    }
    let total: usize = degrees.iter().sum();
    Ok(PageEdges {
        graph: out,
        info: PageGraphInfo {
            page_degree: geo.page_degree(),
            mean_degree: total as f64 / pages.max(1) as f64,
            max_degree: degrees.iter().copied().max().unwrap_or(0),
            mean_candidates: candidates as f64 / pages.max(1) as f64,
            back_edges,
            repairs,
            seconds: t0.elapsed().as_secs_f64(),
        },
    })
}

/// Pages reachable from the page of `start` when a page's edges are the
/// union of its records' lists (what `check` and the tests verify).
pub fn reachable_pages<L: Layout>(graph: &Graph, layout: &L, start: u32) -> Vec<bool> {
    let pages = layout.geometry().n_blocks as usize;
    let mut reached = vec![false; pages];
    if (start as usize) >= graph.n() {
        return reached;
    }
    let mut stack = vec![layout.locate(start).0 as usize];
    reached[stack[0]] = true;
    let mut nodes = Vec::new();
    while let Some(p) = stack.pop() {
        nodes.clear();
        layout.block_nodes(p as u64, &mut nodes);
        for &v in &nodes {
            for &w in graph.neighbors(v) {
                if (w as usize) < graph.n() {
                    let q = layout.locate(w).0 as usize;
                    if !reached[q] {
                        reached[q] = true;
                        stack.push(q);
                    }
                }
            }
        }
    }
    reached
}

#[cfg(test)]
mod tests;
