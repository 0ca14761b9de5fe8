//! Blocking positioned reads of whole blocks into an aligned buffer: the
//! open-time loads (node caches, sampled entry points) read single records
//! this way; searches go through an [`crate::io::IoEngine`] instead.

use super::buffer::AlignedBuf;
use crate::{Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Reads blocks of one size from one file, one at a time.
pub struct BlockReader {
    file: File,
    path: PathBuf,
    block_size: usize,
    buf: AlignedBuf,
}

impl BlockReader {
    /// Opens `path` for reads of `block_size` bytes.
    pub fn open(path: &Path, block_size: usize) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(BlockReader {
            file,
            path: path.to_path_buf(),
            block_size,
            buf: AlignedBuf::new(block_size),
        })
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The block at byte `offset` (4 KiB aligned in memory); a read past the
    /// end of the file is an error naming it.
    pub fn read(&mut self, offset: u64) -> Result<&[u8]> {
        let bs = self.block_size;
        self.file
            .read_exact_at(&mut self.buf.as_mut_slice()[..bs], offset)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::corrupt(
                        &self.path,
                        format!("file is truncated: no {bs}-byte block at offset {offset}"),
                    )
                } else {
                    Error::io(&self.path, e)
                }
            })?;
        Ok(&self.buf.as_slice()[..bs])
    }
}
