//! `check()` of a graph index: every block of the page file read back and
//! verified (checksum, header, records), every edge in range, every node
//! reachable from the start, external ids distinct, and the update
//! layer's maps consistent with the disk graph.

use super::mutable::GraphSlot;
use crate::format::page::verify_block;
use crate::graph::Graph;
use crate::io::BlockReader;
use crate::Result;

/// Problems listed at most (the count is always exact).
const MAX_LISTED: usize = 50;

/// The report of [`GraphSlot`]'s check, as JSON.
pub fn graph(slot: &GraphSlot) -> Result<serde_json::Value> {
    let st = slot.read()?;
    let go = &st.open;
    let m = &go.manifest;
    let (layout, pages) = go.g.layout_and_pages();
    let geo = *layout.geometry();
    let n = m.n;
    let mut problems: Vec<String> = Vec::new();
    let mut count = 0usize;
    let mut note = |p: String, problems: &mut Vec<String>| {
        count += 1;
        if problems.len() < MAX_LISTED {
            problems.push(p);
        }
    };
    let mut graph = Graph::new(n, geo.max_degree.max(1));
    let mut reader = BlockReader::open(&pages, geo.block_size)?;
    let mut nodes = Vec::new();
    let mut seen = vec![false; n];
    let mut edges = 0u64;
    // A PQ-coded layout (AiSAQ): every record's neighbour codes must be
    // those neighbours' codes in the `pq_codes` section.
    let pq_m = geo.pq_code;
    let pq_codes = if pq_m > 0 {
        let dir = pages.parent().unwrap_or(std::path::Path::new("."));
        match crate::io::files::read_section(dir, m, crate::format::Section::PqCodes) {
            Ok(c) if Some(c.len()) == n.checked_mul(pq_m) => Some(c),
            Ok(c) => {
                note(
                    format!(
                        "the pq_codes section has {} bytes, expected {n} × {pq_m}",
                        c.len()
                    ),
                    &mut problems,
                );
                None
            }
            Err(e) => {
                note(format!("the pq_codes section: {e}"), &mut problems);
                None
            }
        }
    } else {
        None
    };
    let mut stale_codes = 0usize;
    for b in 0..geo.n_blocks {
        let block = reader.read(geo.block_offset(b))?;
        if let Err(e) = verify_block(block, b, &geo) {
            note(format!("block {b}: {e}"), &mut problems);
            continue;
        }
        nodes.clear();
        layout.block_nodes(b, &mut nodes);
        for (slot_no, &v) in nodes.iter().enumerate() {
            if v as usize >= n {
                continue;
            }
            match geo.decode(block, slot_no) {
                Ok(rec) => {
                    if seen[v as usize] {
                        note(format!("node {v} is stored twice"), &mut problems);
                    }
                    seen[v as usize] = true;
                    let bad: Vec<u32> = rec
                        .neighbours
                        .iter()
                        .copied()
                        .filter(|&u| u as usize >= n)
                        .collect();
                    if !bad.is_empty() {
                        note(
                            format!("node {v} has edges to {bad:?}, past the {n} nodes"),
                            &mut problems,
                        );
                    }
                    let ok: Vec<u32> = rec
                        .neighbours
                        .iter()
                        .copied()
                        .filter(|&u| (u as usize) < n)
                        .collect();
                    edges += ok.len() as u64;
                    if let Some(all) = &pq_codes {
                        let stale = rec.neighbours.iter().zip(rec.codes.chunks_exact(pq_m)).any(
                            |(&u, c)| {
                                let at = u as usize * pq_m;
                                all.get(at..at + pq_m) != Some(c)
                            },
                        );
                        if stale {
                            stale_codes += 1;
                        }
                    }
                    graph.set_neighbors(v, &ok);
                }
                Err(e) => note(format!("node {v} in block {b}: {e}"), &mut problems),
            }
        }
    }
    // A decoupled layout's vector pages: each read back and verified,
    // holding exactly its share of the nodes' vectors.
    for i in 0..geo.vector_blocks {
        let b = geo.n_blocks + i;
        let block = reader.read(geo.block_offset(b))?;
        if let Err(e) = verify_block(block, b, &geo) {
            note(format!("vector block {b}: {e}"), &mut problems);
            continue;
        }
        let first = (i as usize).saturating_mul(geo.vectors_per_block);
        let want = n.saturating_sub(first).min(geo.vectors_per_block);
        let held = crate::format::page::block_records(block);
        if held != want {
            note(
                format!("vector block {b} holds {held} vectors, expected {want}"),
                &mut problems,
            );
        }
    }
    if stale_codes > 0 {
        note(
            format!(
                "{stale_codes} records carry neighbour PQ codes that differ from the pq_codes \
                 section"
            ),
            &mut problems,
        );
    }
    let missing = seen.iter().filter(|&&s| !s).count();
    if missing > 0 {
        note(
            format!("{missing} of the {n} nodes have no record"),
            &mut problems,
        );
    }
    // Reachability from the start node. On a page graph a page is one
    // node: reaching one record reaches the page, whose edges are the
    // union of its records' lists.
    let page_graph = m.layout.kind.placement() == crate::format::Placement::PageGraph;
    let mut reached = vec![false; n];
    let mut stack = Vec::new();
    if (m.medoid as usize) < n {
        reached[m.medoid as usize] = true;
        stack.push(m.medoid);
    }
    let mut mates = Vec::new();
    while let Some(v) = stack.pop() {
        if page_graph {
            mates.clear();
            layout.block_nodes(layout.locate(v).0, &mut mates);
            for &u in &mates {
                if (u as usize) < n && !reached[u as usize] {
                    reached[u as usize] = true;
                    stack.push(u);
                }
            }
        }
        for &u in graph.neighbors(v) {
            if !reached[u as usize] {
                reached[u as usize] = true;
                stack.push(u);
            }
        }
    }
    // A tombstone (in place) may be unreachable: it is never a result.
    let unreachable = (0..n)
        .filter(|&i| !(reached[i] || st.inplace.is_some() && go.g.external(i as u32) < 0))
        .count();
    if unreachable > 0 {
        note(
            format!(
                "{unreachable} nodes are not reachable from the start node {}",
                m.medoid
            ),
            &mut problems,
        );
    }
    // In place: edges from live nodes to tombstones (a delete's repair
    // missed them; the sweep removes them), none to a slot an insert may
    // take.
    let mut to_tombstones = 0u64;
    if let Some(ip) = &st.inplace {
        let free: std::collections::HashSet<u32> = ip.free_list().iter().copied().collect();
        let dead = |u: u32| go.g.external(u) < 0;
        let mut to_free = 0u64;
        for v in (0..n as u32).filter(|&v| !dead(v)) {
            for &u in graph.neighbors(v) {
                if dead(u) {
                    to_tombstones += 1;
                    to_free += u64::from(free.contains(&u));
                }
            }
        }
        if to_free > 0 {
            note(
                format!("{to_free} edges lead to free slots (an insert would take them)"),
                &mut problems,
            );
        }
    }
    if let Some(ids) = go.g.ids() {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        let dups = sorted
            .windows(2)
            .filter(|w| w[0] == w[1] && w[0] != u64::MAX)
            .count();
        if dups > 0 {
            note(
                format!("{dups} external ids appear more than once"),
                &mut problems,
            );
        }
    }
    for p in st.delta.problems(&go.g) {
        note(p, &mut problems);
    }
    Ok(serde_json::json!({
        "kind": "graph",
        "nodes": n,
        "blocks": geo.n_blocks,
        "edges": edges,
        "unreachable": unreachable,
        "live_ids": n - st.deleted_on_disk() + st.delta.inserted(),
        "deleted_since_merge": st.delta.deleted_on_disk(),
        "tombstones": st.inplace.as_ref().map_or(0, |p| p.deleted()),
        "edges_to_tombstones": to_tombstones,
        "free_slots": st.inplace.as_ref().map_or(0, |p| p.free_list().len()),
        "update": if st.inplace.is_some() { "in_place" } else { "out_of_place" },
        "inserted_since_merge": st.delta.inserted(),
        "problem_count": count,
        "problems": problems,
    }))
}
