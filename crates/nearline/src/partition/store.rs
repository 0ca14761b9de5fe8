//! The block controller: the postings file (`postings.dat`), its free-block
//! pool and positioned O_DIRECT writes of whole 4 KiB blocks.
//!
//! Blocks are never overwritten while a durable checkpoint or the live
//! posting map may point at them:
//! * a posting is changed copy-on-write: its new blocks are written to
//!   free blocks first, then the map is swapped to them, then the blocks it
//!   no longer uses are [`released`](Store::release) — they wait in a
//!   *pending* list;
//! * pending blocks become free only at the next checkpoint
//!   ([`Store::reclaim`]), once a durable map no longer names them and no
//!   search started before the swap can still be reading them (the index
//!   holds its search gate while reclaiming).
//!
//! So a crash at any point leaves the last checkpoint's blocks intact, and
//! a search never reads a block rewritten under it.

use super::posting::{decode_block, encode_block, BLOCK, PAYLOAD};
use crate::io::AlignedBuf;
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Name of the postings file inside an index directory.
pub const POSTINGS_FILE: &str = "postings.dat";
/// Most blocks one read or write covers.
pub const MAX_RUN: usize = 32;

/// Where a posting lives: its blocks in stream order and its entry count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PostingRef {
    pub blocks: Vec<u32>,
    pub count: u32,
}

/// Runs of consecutive blocks `(first block, first index, length)`, at
/// most [`MAX_RUN`] long: each is one read.
pub fn runs(blocks: &[u32]) -> Vec<(u32, u32, u32)> {
    let mut out: Vec<(u32, u32, u32)> = Vec::new();
    for (i, &b) in blocks.iter().enumerate() {
        match out.last_mut() {
            Some(r) if r.0 + r.2 == b && (r.2 as usize) < MAX_RUN => r.2 += 1,
            _ => out.push((b, i as u32, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_come_from_free_blocks_first() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::create(&dir.path().join("p.dat")).unwrap();
        assert_eq!(s.allocate(4).unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(s.allocate(3).unwrap(), vec![4, 5, 6]);
        s.release(&[1, 2, 3, 5]);
        // Released blocks wait for a checkpoint.
        assert_eq!(s.allocate(1).unwrap(), vec![7]);
        s.reclaim();
        assert_eq!(s.allocate(3).unwrap(), vec![1, 2, 3]);
        assert_eq!(s.allocate(2).unwrap(), vec![8, 9]);
        assert_eq!(s.allocate(1).unwrap(), vec![5]);
        assert_eq!(s.counts(), (10, 0, 0));
        assert_eq!(
            runs(&[4, 5, 6, 9, 1, 2]),
            vec![(4, 0, 3), (9, 3, 1), (1, 4, 2)]
        );
    }
}

#[derive(Debug, Default)]
struct Alloc {
    /// Reusable blocks.
    free: Vec<u32>,
    /// Released since the last checkpoint.
    pending: Vec<u32>,
    /// Blocks the file holds (the next block at the end).
    end: u32,
}

/// The postings file.
pub struct Store {
    path: PathBuf,
    file: File,
    direct: bool,
    alloc: Mutex<Alloc>,
}

fn open_rw(path: &Path, create: bool) -> Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(create);
    #[cfg(target_os = "linux")]
    {
        let mut od = o.clone();
        od.custom_flags(libc::O_DIRECT);
        match od.open(path) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    o.open(path)
        .map(|f| (f, false))
        .map_err(|e| Error::io(path, e))
}

impl Store {
    /// Creates an empty postings file at `path`.
    pub fn create(path: &Path) -> Result<Store> {
        if path.exists() {
            std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
        }
        let (file, direct) = open_rw(path, true)?;
        Ok(Store {
            path: path.to_path_buf(),
            file,
            direct,
            alloc: Mutex::new(Alloc::default()),
        })
    }

    /// Opens the postings file of a checkpoint that used `end` blocks and
    /// left `free` unused. A file shorter than `end` blocks is corrupt; a
    /// longer one holds blocks written after the checkpoint (a crash), which
    /// are reused.
    pub fn open(path: &Path, end: u32, free: Vec<u32>) -> Result<Store> {
        let (file, direct) = open_rw(path, false)?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len < end as u64 * BLOCK as u64 {
            return Err(Error::corrupt(
                path,
                format!(
                    "postings file is truncated: {len} bytes, the checkpoint names {end} blocks \
                     of {BLOCK}"
                ),
            ));
        }
        if let Some(&b) = free.iter().find(|&&b| b >= end) {
            return Err(Error::corrupt(
                path,
                format!("free block {b} lies past the checkpoint's {end} blocks"),
            ));
        }
        Ok(Store {
            path: path.to_path_buf(),
            file,
            direct,
            alloc: Mutex::new(Alloc {
                free,
                pending: Vec::new(),
                end,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Whether writes and reads bypass the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Alloc> {
        self.alloc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `n` blocks for new data, consecutive (one read covers them): the
    /// first run of `n` free blocks, else new blocks at the end of the file.
    pub fn allocate(&self, n: usize) -> Result<Vec<u32>> {
        let mut a = self.lock();
        if n == 0 {
            return Ok(Vec::new());
        }
        if a.free.len() >= n {
            a.free.sort_unstable();
            let f = &a.free;
            let mut start = 0;
            for i in 0..f.len() {
                if i > 0 && f[i] != f[i - 1] + 1 {
                    start = i;
                }
                if i + 1 - start == n {
                    let run: Vec<u32> = a.free.drain(start..=i).collect();
                    return Ok(run);
                }
            }
        }
        let start = a.end;
        let end = (start as u64) + n as u64;
        if end > u32::MAX as u64 {
            return Err(Error::arg(format!(
                "{}: the postings file cannot hold more than {} blocks",
                self.path.display(),
                u32::MAX
            )));
        }
        a.end = end as u32;
        Ok((start..end as u32).collect())
    }

    /// Blocks a posting stopped using (reusable after the next checkpoint).
    pub fn release(&self, blocks: &[u32]) {
        self.lock().pending.extend_from_slice(blocks);
    }

    /// Blocks allocated never used (a failed write): reusable at once.
    pub fn give_back(&self, blocks: &[u32]) {
        self.lock().free.extend_from_slice(blocks);
    }

    /// Pending blocks become free (call after a durable checkpoint, with no
    /// search running that started before the blocks were released).
    pub fn reclaim(&self) {
        let mut a = self.lock();
        let p = std::mem::take(&mut a.pending);
        a.free.extend(p);
    }

    /// `(end, free ∪ pending)`: what a checkpoint taken now records (the
    /// pending blocks are unused by the map it saves).
    pub fn snapshot(&self) -> (u32, Vec<u32>) {
        let a = self.lock();
        let mut f = a.free.clone();
        f.extend_from_slice(&a.pending);
        f.sort_unstable();
        (a.end, f)
    }

    /// Whether enough released blocks wait for a checkpoint that one should
    /// run: a quarter of the file, and at least 8,192 blocks (32 MiB; a
    /// small index is left to explicit checkpoints).
    pub fn wants_reclaim(&self) -> bool {
        let a = self.lock();
        a.pending.len() >= 8192 && a.pending.len() * 4 >= a.end as usize
    }

    /// `(blocks in the file, free, pending)`.
    pub fn counts(&self) -> (u32, usize, usize) {
        let a = self.lock();
        (a.end, a.free.len(), a.pending.len())
    }

    /// Writes the entry stream of posting `posting` into `blocks` (its
    /// blocks `first_index..` in order), a run of consecutive blocks per
    /// write.
    pub fn write(
        &self,
        posting: u32,
        first_index: u32,
        blocks: &[u32],
        stream: &[u8],
    ) -> Result<()> {
        for (b0, i0, len) in runs(blocks) {
            let mut buf = AlignedBuf::new(len as usize * BLOCK);
            for j in 0..len as usize {
                let off = ((i0 as usize + j) * PAYLOAD).min(stream.len());
                encode_block(
                    posting,
                    first_index + i0 + j as u32,
                    &stream[off..],
                    &mut buf.as_mut_slice()[j * BLOCK..(j + 1) * BLOCK],
                );
            }
            self.file
                .write_all_at(buf.as_slice(), b0 as u64 * BLOCK as u64)
                .map_err(|e| Error::io(&self.path, e))?;
        }
        Ok(())
    }

    /// Reads posting `posting`'s whole entry stream (blocking; updates and
    /// checks use this, searches go through an I/O engine).
    pub fn read(&self, posting: u32, r: &PostingRef) -> Result<Vec<u8>> {
        let mut stream = Vec::with_capacity(r.blocks.len() * PAYLOAD);
        for (b0, i0, len) in runs(&r.blocks) {
            let mut buf = AlignedBuf::new(len as usize * BLOCK);
            let got = read_full(&self.file, buf.as_mut_slice(), b0 as u64 * BLOCK as u64)
                .map_err(|e| Error::io(&self.path, e))?;
            for j in 0..len as usize {
                let blk = &buf.as_slice()[j * BLOCK..(j * BLOCK + BLOCK).min(got.max(j * BLOCK))];
                decode_block(
                    &self.path,
                    b0 + j as u32,
                    posting,
                    i0 + j as u32,
                    blk,
                    &mut stream,
                )?;
            }
        }
        Ok(stream)
    }

    /// Reads the single block `block` (block `index` of `posting`): its
    /// payload.
    pub fn read_block(&self, posting: u32, index: u32, block: u32) -> Result<Vec<u8>> {
        let mut buf = AlignedBuf::new(BLOCK);
        let got = read_full(&self.file, buf.as_mut_slice(), block as u64 * BLOCK as u64)
            .map_err(|e| Error::io(&self.path, e))?;
        let mut out = Vec::with_capacity(BLOCK);
        decode_block(
            &self.path,
            block,
            posting,
            index,
            &buf.as_slice()[..got],
            &mut out,
        )?;
        Ok(out)
    }

    /// Makes every write so far durable.
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(&self.path, e))
    }
}

/// Reads up to `buf.len()` bytes at `offset`; returns the bytes read (short
/// at the end of the file).
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
