use super::*;
use crate::format::page::{PageGeometry, LAYOUT_PAGE_GRAPH};
use crate::format::Placement;
use crate::layout::ShuffledLayout;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

/// Vectors of `dim` dimensions, a node graph of degree `r` whose ring
/// edges (v → v + 1) make every node reachable from node 0, and a random
/// placement on pages of `records` records each.
fn case(
    n: usize,
    dim: usize,
    r: usize,
    per_record: usize,
    records: usize,
    seed: u64,
) -> (Matrix<f32>, Graph, ShuffledLayout) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let rows: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
    let data = Matrix::from_vec(rows, n, dim).expect("matrix");
    let mut g = Graph::new(n, r);
    for v in 0..n as u32 {
        let mut l = vec![(v + 1) % n as u32];
        while l.len() < r {
            l.push(rng.random_range(0..n as u32));
        }
        g.set_neighbors(v, &l);
    }
    // A geometry of `records` records a page whose lists hold `per_record`.
    let mut geo = PageGeometry::new(4096, dim * 4, per_record, n).expect("geometry");
    geo.records_per_block = records;
    geo.n_blocks = n.div_ceil(records) as u64;
    // (A page's records fill its first slots, as a shuffle places them.)
    let mut pos: Vec<u32> = (0..n as u32).collect();
    rand::seq::SliceRandom::shuffle(pos.as_mut_slice(), &mut rng);
    let l = ShuffledLayout::placed(geo, pos, Placement::PageGraph).expect("layout");
    (data, g, l)
}

fn page(l: &ShuffledLayout, v: u32) -> u64 {
    l.locate(v).0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over random graphs and placements: every record's list fits its
    /// bound, no edge stays inside its page, no page has two edges to one
    /// page, every page edge comes from a node-graph edge between the two
    /// pages (either way), and every page is reachable from the start's
    /// (pages of four edges or more: with fewer, the edges of the tree that
    /// reaches them can leave no page room to lead further).
    #[test]
    fn page_edges_leave_the_page_once_per_target_and_reach_every_page(
        n in 2usize..300,
        dim in 1usize..8,
        r in 1usize..10,
        per_record in 2usize..6,
        records in 2usize..9,
        seed in any::<u64>(),
    ) {
        let (data, g, l) = case(n, dim, r, per_record, records, seed);
        let start = (seed % n as u64) as u32;
        let pe = build(&data, &g, Metric::L2, &l, start, &AtomicBool::new(false)).unwrap();
        let mut linked = std::collections::HashSet::new();
        for v in 0..n as u32 {
            for &w in g.neighbors(v) {
                linked.insert((page(&l, v), page(&l, w)));
                linked.insert((page(&l, w), page(&l, v)));
            }
        }
        let mut nodes = Vec::new();
        for b in 0..l.geometry().n_blocks {
            nodes.clear();
            l.block_nodes(b, &mut nodes);
            let mut to = Vec::new();
            for &v in &nodes {
                let list = pe.graph.neighbors(v);
                prop_assert!(list.len() <= per_record);
                for &w in list {
                    prop_assert!((w as usize) < n);
                    prop_assert_ne!(page(&l, w), b, "edge inside page {}", b);
                    prop_assert!(linked.contains(&(b, page(&l, w))));
                    to.push(page(&l, w));
                }
            }
            let k = to.len();
            to.sort_unstable();
            to.dedup();
            prop_assert_eq!(to.len(), k, "page {} has two edges to one page", b);
        }
        let reached = reachable_pages(&pe.graph, &l, start);
        prop_assert!(reached.iter().all(|&r| r), "pages unreachable: {:?}", pe.info);
        prop_assert!(pe.info.max_degree <= records * per_record);
    }
}

#[test]
fn a_page_keeps_its_nearest_pages_and_takes_back_edges() {
    // Points on a line, two to a page in order: page p holds 2p and 2p+1.
    // Each node links to every other node, so page 0's candidates are
    // every other page, nearest first.
    let n = 12;
    let data = Matrix::from_vec((0..n).map(|i| i as f32).collect(), n, 1).unwrap();
    let mut g = Graph::new(n, n - 1);
    for v in 0..n as u32 {
        let l: Vec<u32> = (0..n as u32).filter(|&u| u != v).collect();
        g.set_neighbors(v, &l);
    }
    let mut geo = PageGeometry::new(4096, 4, 1, n).unwrap();
    geo.records_per_block = 2;
    geo.n_blocks = 6;
    let l = ShuffledLayout::placed(geo, (0..n as u32).collect(), Placement::PageGraph).unwrap();
    assert_eq!(l.geometry().layout_id, LAYOUT_PAGE_GRAPH);
    let pe = build(&data, &g, Metric::L2, &l, 0, &AtomicBool::new(false)).unwrap();
    // Page 0 (nodes 0, 1) holds 2 edges: to pages 1 and 2, its nearest;
    // page 5 (10, 11) to pages 4 and 3.
    let pages_of = |p: u32| {
        let mut t: Vec<u64> = [2 * p, 2 * p + 1]
            .iter()
            .flat_map(|&v| pe.graph.neighbors(v).to_vec())
            .map(|w| page(&l, w))
            .collect();
        t.sort_unstable();
        t
    };
    assert_eq!(pages_of(0), vec![1, 2]);
    assert_eq!(pages_of(5), vec![3, 4]);
    // Through node 2, the nearest of page 1 to node 1.
    assert!(pe.graph.neighbors(1).contains(&2));
    assert_eq!(pe.info.page_degree, 2);
    assert!(pe.info.mean_candidates >= 5.0 - 1e-9);
    assert!(reachable_pages(&pe.graph, &l, 0).iter().all(|&r| r));
}

#[test]
fn a_cancelled_build_stops() {
    let (data, g, l) = case(50, 2, 4, 2, 3, 7);
    let r = build(&data, &g, Metric::L2, &l, 0, &AtomicBool::new(true));
    assert!(matches!(r, Err(Error::Cancelled)));
}
