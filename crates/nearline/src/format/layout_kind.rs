//! A page file's layout as two components (seed 002's layout dimension,
//! split): the **placement** (which block holds node v) and the **record
//! format** (what a record carries beside its vector and adjacency list).
//!
//! [`LayoutKind`] is the pair, written so that only the pairs this engine
//! builds and reads can exist: plain records take either placement, while
//! the formats that carry other nodes' data (replicated lists, neighbour
//! codes) are laid out in ID order, because a builder chooses what a record
//! carries from the records around it in ID order; decoupled records (DGAI)
//! are in ID order too, their vector pages following the same order. Code that asks "where is
//! node v" matches on [`LayoutKind::placement`]; code that asks "what does a
//! record hold" matches on [`LayoutKind::records`]; neither has to list the
//! other component's cases.
//!
//! Manifests and the APIs name a layout by one word (`id`, `shuffled`,
//! `page_graph`, `replicated`, `coded`, `pq_coded`, `decoupled`), as before
//! the split.

use crate::{Error, Result};

crate::util::vocabulary! {
    /// Where records go in the page file: the layout's placement component.
    pub enum Placement: "placement" {
        /// DiskANN's: node v in block v / records_per_block (the
        /// `id_to_location` map is the identity and is not stored).
        Id = "id",
        /// Starling's block shuffling: a node shares its block with graph
        /// neighbours; node → position map in the `id_to_location` section.
        Shuffled = "shuffled",
        /// PageANN's page graph: records grouped into pages by proximity,
        /// and the graph is over pages: a page's out-edges (to other
        /// pages, each through one of its nodes) are spread over its
        /// records, so a page is read and expanded as one node; node →
        /// position map in the `id_to_location` section.
        PageGraph = "page_graph",
    }
}

crate::util::vocabulary! {
    /// What a record holds beside its vector and adjacency list: the
    /// layout's record-format component.
    pub enum RecordFormat: "record format" {
        /// Nothing else (DiskANN, Starling).
        Plain = "plain",
        /// Gorgeous' graph-replicated records: each record also carries the
        /// adjacency lists of some of its neighbours.
        Replicated = "replicated",
        /// AlayaLaser's coded records: each carries its neighbours' RaBitQ
        /// codes (format 1.4); vectors stored in the index's PCA space.
        Coded = "coded",
        /// AiSAQ's PQ-coded records: each carries its neighbours' PQ codes
        /// (format 1.8); only the PQ codebook is held in memory.
        PqCoded = "pq_coded",
        /// DGAI's decoupled records: a record holds the adjacency list
        /// only (topology pages), and the vectors lie in pages of their
        /// own after them, read for the final re-rank (format 1.10).
        Decoupled = "decoupled",
    }
}

impl Placement {
    /// Whether node positions are stored (the `id_to_location` section and
    /// its two maps in memory) rather than computed from the id.
    pub fn stores_positions(self) -> bool {
        !matches!(self, Placement::Id)
    }
}

impl RecordFormat {
    /// Whether a record carries codes that score its neighbours (so the
    /// index holds no per-node codes in memory for routing).
    pub fn carries_codes(self) -> bool {
        matches!(self, RecordFormat::Coded | RecordFormat::PqCoded)
    }
}

/// A layout: a placement × a record format, only as the pairs that exist.
///
/// Plain records take any placement; a record format that carries other
/// nodes' data is placed in ID order (its variant has no placement to
/// give), so a shuffled replicated or shuffled coded layout cannot be
/// written. [`LayoutKind::new`] builds one from its two components and says
/// why a pair is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayoutKind {
    /// Plain records (a vector and an adjacency list) at a placement.
    Plain(Placement),
    /// Graph-replicated records (Gorgeous), in ID order.
    Replicated,
    /// Records carrying neighbours' RaBitQ codes (AlayaLaser), in ID order.
    Coded,
    /// Records carrying neighbours' PQ codes (AiSAQ), in ID order.
    PqCoded,
    /// Topology records and separate vector pages (DGAI), in ID order.
    Decoupled,
}

impl LayoutKind {
    /// DiskANN's layout: plain records in ID order.
    pub const ID: LayoutKind = LayoutKind::Plain(Placement::Id);
    /// Starling's layout: plain records, block-shuffled.
    pub const SHUFFLED: LayoutKind = LayoutKind::Plain(Placement::Shuffled);
    /// PageANN's layout: plain records on a page graph.
    pub const PAGE_GRAPH: LayoutKind = LayoutKind::Plain(Placement::PageGraph);
    /// Every layout, in the order of their names.
    pub const ALL: &'static [LayoutKind] = &[
        LayoutKind::ID,
        LayoutKind::SHUFFLED,
        LayoutKind::PAGE_GRAPH,
        LayoutKind::Replicated,
        LayoutKind::Coded,
        LayoutKind::PqCoded,
        LayoutKind::Decoupled,
    ];

    /// The layout of records of format `records` at `placement`; an error
    /// says why a pair does not exist.
    pub fn new(placement: Placement, records: RecordFormat) -> Result<LayoutKind> {
        match (records, placement) {
            (RecordFormat::Plain, p) => Ok(LayoutKind::Plain(p)),
            (RecordFormat::Replicated, Placement::Id) => Ok(LayoutKind::Replicated),
            (RecordFormat::Coded, Placement::Id) => Ok(LayoutKind::Coded),
            (RecordFormat::PqCoded, Placement::Id) => Ok(LayoutKind::PqCoded),
            (RecordFormat::Decoupled, Placement::Id) => Ok(LayoutKind::Decoupled),
            (RecordFormat::Decoupled, p) => Err(Error::arg(format!(
                "decoupled records are laid out in ID order (their vector pages follow the \
                 topology pages' order; a {p} placement of the topology pages is not built), \
                 so placement {p} does not apply to them; use placement id"
            ))),
            (r, p) => Err(Error::arg(format!(
                "{r} records are laid out in ID order (what a record carries is chosen from \
                 its ID-order neighbours), so placement {p} does not apply to them; use \
                 placement id, or plain records for a {p} placement"
            ))),
        }
    }

    /// Which block holds node v.
    pub fn placement(self) -> Placement {
        match self {
            LayoutKind::Plain(p) => p,
            LayoutKind::Replicated
            | LayoutKind::Coded
            | LayoutKind::PqCoded
            | LayoutKind::Decoupled => Placement::Id,
        }
    }

    /// What a record holds.
    pub fn records(self) -> RecordFormat {
        match self {
            LayoutKind::Plain(_) => RecordFormat::Plain,
            LayoutKind::Replicated => RecordFormat::Replicated,
            LayoutKind::Coded => RecordFormat::Coded,
            LayoutKind::PqCoded => RecordFormat::PqCoded,
            LayoutKind::Decoupled => RecordFormat::Decoupled,
        }
    }

    /// The one-word name stored in manifests and accepted by the APIs.
    pub fn name(self) -> &'static str {
        match self {
            LayoutKind::Plain(Placement::Id) => "id",
            LayoutKind::Plain(Placement::Shuffled) => "shuffled",
            LayoutKind::Plain(Placement::PageGraph) => "page_graph",
            LayoutKind::Replicated => "replicated",
            LayoutKind::Coded => "coded",
            LayoutKind::PqCoded => "pq_coded",
            LayoutKind::Decoupled => "decoupled",
        }
    }

    /// Parses a name (case-insensitive, surrounding spaces ignored).
    pub fn parse(s: &str) -> Result<LayoutKind> {
        let t = s.trim().to_ascii_lowercase();
        LayoutKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == t)
            .ok_or_else(|| {
                Error::arg(format!(
                    "unknown layout {s:?}: expected one of {}",
                    LayoutKind::names().join(", ")
                ))
            })
    }

    /// Every name, in declaration order.
    pub fn names() -> Vec<&'static str> {
        LayoutKind::ALL.iter().map(|k| k.name()).collect()
    }
}

impl std::fmt::Display for LayoutKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for LayoutKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for LayoutKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        LayoutKind::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_either_exists_once_or_is_refused_with_its_reason() {
        let mut made = Vec::new();
        for &p in Placement::ALL {
            for &r in RecordFormat::ALL {
                match LayoutKind::new(p, r) {
                    Ok(k) => {
                        assert_eq!((k.placement(), k.records()), (p, r));
                        made.push(k);
                    }
                    Err(e) => {
                        let e = e.to_string();
                        assert!(
                            r != RecordFormat::Plain && p != Placement::Id,
                            "{p} {r}: {e}"
                        );
                        assert!(e.contains("ID order") && e.contains(p.name()), "{e}");
                    }
                }
            }
        }
        made.sort();
        let mut all = LayoutKind::ALL.to_vec();
        all.sort();
        assert_eq!(made, all, "every layout is exactly one valid pair");
    }

    #[test]
    fn names_round_trip_through_parse_and_serde() {
        for &k in LayoutKind::ALL {
            assert_eq!(LayoutKind::parse(k.name()).ok(), Some(k));
            assert_eq!(
                LayoutKind::parse(&format!(" {} ", k.name().to_uppercase())).ok(),
                Some(k)
            );
            let json = serde_json::to_string(&k).expect("serialize");
            assert_eq!(json, format!("\"{}\"", k.name()));
            let back: LayoutKind = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back, k);
        }
        let e = LayoutKind::parse("zigzag").expect_err("unknown");
        assert!(
            e.to_string()
                .contains("id, shuffled, page_graph, replicated, coded, pq_coded, decoupled"),
            "{e}"
        );
        assert!(serde_json::from_str::<LayoutKind>("\"zigzag\"").is_err());
    }

    #[test]
    fn only_plain_records_are_shuffled_and_only_coded_formats_carry_codes() {
        assert_eq!(LayoutKind::SHUFFLED.placement(), Placement::Shuffled);
        assert_eq!(LayoutKind::PAGE_GRAPH.placement(), Placement::PageGraph);
        for &k in LayoutKind::ALL {
            if k.placement() != Placement::Id {
                assert_eq!(k.records(), RecordFormat::Plain);
            }
            assert_eq!(
                k.records().carries_codes(),
                matches!(k, LayoutKind::Coded | LayoutKind::PqCoded)
            );
        }
    }
}
