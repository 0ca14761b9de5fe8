//! Range search (Starling §5.3): every point within a radius. The search is
//! a top-k search whose list doubles while the results within the radius
//! fill at least φ of it; candidates pushed off the list (the kicked set P)
//! come back when it grows.

use super::query::{Env, Query};
use super::scorer::Scorer;
use crate::cache::Cache;
use crate::elem::Element;
use crate::layout::Layout;

/// Sorts (distance, id) pairs and keeps one per id (they are equal: the
/// exact distance of a node does not depend on the page it came from).
#[inline]
pub fn sort_dedup(v: &mut Vec<(f32, u32)>) {
    v.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    v.dedup_by_key(|e| e.1);
}

/// When the list is exhausted: if the results within the radius fill at
/// least φ of the list, double the list, move the closest kicked
/// candidates back into it and go on. Returns whether the query continues
/// (always false for a top-k search).
pub fn widen<T: Element, L: Layout, S: Scorer, C: Cache>(
    env: &Env<'_, T, L, S, C>,
    q: &mut Query<T>,
) -> bool {
    let Some(r) = env.plan.range else {
        return false;
    };
    let cap = q.cand.capacity();
    if cap >= r.max_l {
        return false;
    }
    sort_dedup(&mut q.exact);
    let within = q.exact.partition_point(|e| e.0 <= r.radius);
    if (within as f64) < r.ratio as f64 * cap as f64 {
        return false;
    }
    q.cand.grow((cap * 2).min(r.max_l));
    q.stats.doublings += 1;
    // The closest kicked candidates that were not expanded since.
    let kicked = q.range.items_mut();
    kicked.sort_unstable_by(|a, b| b.dist.total_cmp(&a.dist).then(b.id.cmp(&a.id)));
    let mut added = false;
    while let Some(c) = kicked.pop() {
        if q.colocated.contains_key(&c.id) {
            continue;
        }
        match q.cand.insert_kick(c.dist, c.id) {
            None => added = true,
            Some(k) => {
                if k.id != c.id {
                    added = true;
                }
                if !k.expanded {
                    kicked.push(k);
                }
                break;
            }
        }
    }
    added || q.cand.has_unexpanded()
}
