//! `nearline check` of a partition index: every block, entry, id and
//! version against the in-memory maps.

use super::posting::{self, entry_bytes, entry_head};
use super::state::Histogram;
use super::store::PostingRef;
use super::{lock, read, CheckReport, Inner, DELETED};
use crate::Result;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Inner {
    pub(super) fn check(&self) -> Result<CheckReport> {
        let _u = lock(&self.update);
        let _m = lock(&self.maint);
        let mut rep = CheckReport::default();
        let dim = self.dim;
        let postings: Vec<(u32, Arc<PostingRef>)> = read(&self.postings)
            .iter()
            .enumerate()
            .filter_map(|(p, r)| r.clone().map(|r| (p as u32, r)))
            .collect();
        let versions: Vec<u32> = read(&self.versions)
            .iter()
            .map(|v| v.load(Ordering::Acquire))
            .collect();
        let heads = read(&self.heads);
        let (end, _, _) = self.store.counts();
        let (_, free_list) = self.store.snapshot();
        let mut used = vec![false; end as usize];
        let mut found = vec![false; versions.len()];
        let mut current: HashMap<u32, u32> = HashMap::new();
        let mut copies = vec![0u32; versions.len()];
        // Per live id: its nearest head (found from its first entry seen)
        // and whether that head's posting holds it.
        let mut nearest: HashMap<u32, (u32, bool)> = HashMap::new();
        let mut sc = crate::graph::vamana::SearchScratch::new();
        let mut v = vec![0f32; dim];
        let external_all = read(&self.external).clone();
        let external_of = |i: u32| external_all.get(i as usize).copied().unwrap_or(u64::MAX);
        for &b in &free_list {
            if let Some(u) = used.get_mut(b as usize) {
                *u = true;
            }
        }
        for (p, r) in &postings {
            rep.postings += 1;
            if !heads.is_alive(*p) {
                rep.problems.push(format!("posting {p} has no live head"));
            }
            for &b in &r.blocks {
                rep.blocks += 1;
                match used.get_mut(b as usize) {
                    Some(u) if !*u => *u = true,
                    Some(_) => rep
                        .problems
                        .push(format!("block {b} is used twice (or also free)")),
                    None => rep
                        .problems
                        .push(format!("block {b} lies past the file's {end} blocks")),
                }
            }
            let s = match self.store.read(*p, r) {
                Ok(s) => s,
                Err(e) => {
                    rep.problems.push(e.to_string());
                    continue;
                }
            };
            if s.len() < r.count as usize * entry_bytes(dim) {
                rep.problems.push(format!(
                    "posting {p} holds fewer bytes than its {} entries",
                    r.count
                ));
                continue;
            }
            let e = entry_bytes(dim);
            let mut here: HashSet<u32> = HashSet::new();
            for i in 0..r.count as usize {
                let h = entry_head(&s, dim, i);
                rep.entries += 1;
                match versions.get(h.id as usize) {
                    None => rep
                        .problems
                        .push(format!("posting {p} names unknown internal id {}", h.id)),
                    Some(&c) if c & DELETED == 0 && c == h.version => {
                        rep.live_entries += 1;
                        found[h.id as usize] = true;
                        copies[h.id as usize] += 1;
                        let (n, held) = nearest.entry(h.id).or_insert_with(|| {
                            posting::read_entry(&s, dim, i, &mut v);
                            let near = heads.search(&mut sc, &v, 1, super::build::REPLICA_L);
                            (near.first().map_or(*p, |&(_, n)| n), false)
                        });
                        *held |= *n == *p;
                        if !here.insert(h.id) {
                            rep.problems.push(format!(
                                "posting {p} holds live id {} twice",
                                external_of(h.id)
                            ));
                        }
                        // Every current entry of an id is a copy of one
                        // vector: a second vector at the current version is
                        // a stale entry the version no longer tells apart.
                        let vector = crc32c::crc32c(&s[i * e + posting::ENTRY_HEAD..(i + 1) * e]);
                        if *current.entry(h.id).or_insert(vector) != vector {
                            rep.problems.push(format!(
                                "live id {} has entries of two different vectors at its current \
                                 version {c} (posting {p}): a stale entry reads as current",
                                external_of(h.id)
                            ));
                        }
                    }
                    Some(&c) if c & DELETED == 0 && h.version > c => {
                        rep.problems.push(format!(
                            "posting {p} holds version {} of live id {}, which is at version {c}",
                            h.version,
                            external_of(h.id)
                        ));
                    }
                    Some(_) => rep.stale_entries += 1,
                }
            }
        }
        for s in 0..heads.slots() as u32 {
            if heads.is_alive(s) && postings.iter().all(|(p, _)| *p != s) {
                rep.problems.push(format!("head {s} has no posting"));
            }
        }
        // Replication: the postings each live id is in, at most `replicas`.
        let live_copies: Vec<usize> = versions
            .iter()
            .zip(&copies)
            .filter(|(&v, _)| v & DELETED == 0)
            .map(|(_, &c)| c as usize)
            .collect();
        rep.replicas = Histogram::of(&live_copies);
        for (i, (&v, &c)) in versions.iter().zip(&copies).enumerate() {
            if v & DELETED == 0 && c as usize > self.params.replicas {
                rep.problems.push(format!(
                    "live id {} is in {c} postings, more than replicas = {}",
                    external_of(i as u32),
                    self.params.replicas
                ));
            }
        }
        rep.outside_nearest = nearest.values().filter(|(_, held)| !held).count() as u64;
        let ids = lock(&self.ids);
        let external = read(&self.external);
        for (i, &v) in versions.iter().enumerate() {
            if v & DELETED == 0 {
                rep.live_ids += 1;
                if !found[i] {
                    rep.problems
                        .push(format!("live id {} is in no posting", external[i]));
                }
                if ids.tracker.get(external[i]) != Some(i as u32) {
                    rep.problems.push(format!(
                        "live id {} is missing from the id map",
                        external[i]
                    ));
                }
            }
        }
        if ids.tracker.len() as u64 != rep.live_ids {
            rep.problems.push(format!(
                "the id map holds {} ids, the version map {} live ones",
                ids.tracker.len(),
                rep.live_ids
            ));
        }
        rep.problems.truncate(100);
        Ok(rep)
    }
}
