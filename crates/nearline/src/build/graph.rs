//! Build phase 2: the Vamana graph, one-shot or sharded within the build
//! memory budget.

use super::{BuildPlan, Progress};
use crate::data::matrix::Matrix;
use crate::elem::Element;
use crate::graph::{build_with_budget, plan_graph_build, Graph, GraphBuild, VamanaParams};
use crate::Result;
use std::sync::atomic::AtomicBool;

/// The graph, its medoid and the number of shards it was built in (1 for
/// a one-shot build).
pub struct BuiltGraph {
    pub graph: Graph,
    pub medoid: u32,
    pub shards: usize,
}

/// Builds the graph over `data` within `budget` bytes.
pub fn run<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    budget: u64,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<BuiltGraph> {
    let (n, dim) = (data.n(), data.dim());
    let params = VamanaParams {
        r: plan.r,
        l: plan.build_l,
        alpha: plan.alpha,
        passes: plan.passes,
        seed: plan.seed,
        saturate: plan.saturate,
        ..VamanaParams::default()
    };
    let esz = T::DTYPE.size();
    // (The planner checked that a plan fits; an error here is reported by
    // the build below.)
    let shards = match plan_graph_build(n, dim, esz, plan.r, budget, rayon::current_num_threads()) {
        Ok(GraphBuild::OneShot) => 1,
        Ok(GraphBuild::Sharded(p)) => p.shards,
        Err(_) => 0,
    };
    let gp = |d: u64, t: u64| progress("graph", d, t);
    let (graph, medoid) = build_with_budget(data, plan.metric, &params, budget, &gp, cancel)?;
    Ok(BuiltGraph {
        graph,
        medoid,
        shards,
    })
}
