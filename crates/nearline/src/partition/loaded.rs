//! A checkpoint read back: the state file a manifest names, checked against
//! the manifest and the postings file, and the rows of a logged insert. Both
//! the writer's open (`recovery.rs`) and a read-only reader (`reader.rs`)
//! load through here.

use super::posting;
use super::state::{PartitionManifest, State};
use super::DELETED;

use crate::graph::dynamic::DynamicGraph as Heads;
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// A checkpoint's state, checked against its manifest and postings file.
pub(super) struct Loaded {
    pub(super) m: PartitionManifest,
    pub(super) st: State,
    pub(super) heads: Heads,
    pub(super) by_ext: HashMap<u64, u32>,
}

/// Loads and checks the state that manifest `m` names.
pub(super) fn load_state(dir: &Path, m: PartitionManifest) -> Result<Loaded> {
    let spath = dir.join(&m.state_file);
    let bytes = std::fs::read(&spath).map_err(|e| Error::io(&spath, e))?;
    if bytes.len() as u64 != m.state_bytes || crc32c::crc32c(&bytes) != m.state_crc32c {
        return Err(Error::corrupt(
            &spath,
            format!(
                "state file is {} bytes with CRC {:08x}; the manifest expects {} bytes with \
                 CRC {:08x}",
                bytes.len(),
                crc32c::crc32c(&bytes),
                m.state_bytes,
                m.state_crc32c
            ),
        ));
    }
    let st = State::decode(&spath, &bytes)?;
    if st.dim != m.dim || st.versions.len() != st.external.len() {
        return Err(Error::corrupt(&spath, "state does not match the manifest"));
    }
    for (p, r) in st.postings.iter().enumerate() {
        if let Some(r) = r {
            let need = posting::blocks_for(r.count as usize, m.dim);
            if r.blocks.len() < need || r.blocks.iter().any(|&b| b >= st.blocks_end) {
                return Err(Error::corrupt(
                    &spath,
                    format!("posting {p} names blocks the postings file does not hold"),
                ));
            }
        }
    }
    let heads = Heads::from_parts(
        m.dim,
        m.metric,
        st.head_alive.clone(),
        st.head_vecs.clone(),
        &st.head_lists,
        st.head_start,
        st.head_free.clone(),
    );
    let mut by_ext = HashMap::with_capacity(st.versions.len());
    for (i, (&v, &e)) in st.versions.iter().zip(&st.external).enumerate() {
        if v & DELETED == 0 && by_ext.insert(e, i as u32).is_some() {
            return Err(Error::corrupt(&spath, format!("id {e} is live twice")));
        }
    }
    Ok(Loaded {
        m,
        st,
        heads,
        by_ext,
    })
}
