//! The block controller: the postings file (`postings.dat`), its free-block
//! pool and O_DIRECT writes of whole checksummed 4 KiB blocks through an I/O
//! engine of the index's engine kind (io_uring or pread, as its searches).
//!
//! A posting write encodes its blocks (each with its CRC32C), submits every
//! run of consecutive blocks at once and waits for all of them, so a
//! multi-run posting is written in parallel; it returns only when every
//! write has completed (or failed), so a failed write's blocks can be given
//! back safely. Each writing thread takes an engine from a small pool (one
//! per concurrent writer), so writers never serialize on one ring.
//!
//! Blocks are never overwritten while a durable checkpoint or the live
//! posting map may point at them:
//! * a posting is changed copy-on-write: its new blocks are written to
//!   free blocks first, then the map is swapped to them, then the blocks it
//!   no longer uses are [`released`](Store::release) — they wait in a
//!   *pending* list;
//! * pending blocks become free only at a checkpoint
//!   ([`Store::reclaim`]), once a durable map no longer names them and no
//!   search started before the swap can still be reading them (the index
//!   holds its search gate while reclaiming) — and no reader in another
//!   process still uses a checkpoint older than their release: a
//!   checkpoint seals the pending blocks with the generation they were
//!   released under, and frees a sealed lot only once every reader has
//!   moved past that generation.
//!
//! So a crash at any point leaves the last checkpoint's blocks intact, and
//! a search never reads a block rewritten under it.

use super::posting::{decode_block, decode_run, encode_block, BLOCK, PAYLOAD};
use crate::io::{
    open_direct, open_direct_rw, AlignedBuf, Completion, EngineKind, IoCounters, IoEngine, ALIGN,
};
use crate::{Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Writes (runs of blocks) one write engine keeps in flight.
pub const WRITE_DEPTH: u32 = 32;

// A block is written as is: it must satisfy the engines' write alignment.
const _: () = assert!(BLOCK.is_multiple_of(ALIGN));

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
        s.reclaim(1, None);
        assert_eq!(s.allocate(3).unwrap(), vec![1, 2, 3]);
        assert_eq!(s.allocate(2).unwrap(), vec![8, 9]);
        assert_eq!(s.allocate(1).unwrap(), vec![5]);
        assert_eq!(s.counts(), (10, 0, 0));
        // A reader holding generation 2 keeps what was released under it
        // (and later) from reuse; once it moves on, they are free.
        s.release(&[0, 4]);
        s.reclaim(2, Some(2));
        s.release(&[6]);
        s.reclaim(3, Some(2));
        assert_eq!(s.counts(), (10, 0, 3));
        assert_eq!(s.snapshot(), (10, vec![0, 4, 6]));
        assert_eq!(s.allocate(1).unwrap(), vec![10]);
        s.reclaim(4, Some(3));
        assert_eq!(s.counts(), (11, 2, 1));
        s.reclaim(5, None);
        assert_eq!(s.counts(), (11, 3, 0));
        assert_eq!(
            runs(&[4, 5, 6, 9, 1, 2]),
            vec![(4, 0, 3), (9, 3, 1), (1, 4, 2)]
        );
    }

    /// A posting of several runs (scattered blocks, one run longer than
    /// [`MAX_RUN`]) written through an engine of `kind` reads back whole.
    fn multi_run_write(kind: EngineKind) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.dat");
        let s = match Store::create_with_io(&path, kind) {
            Ok(s) => s,
            Err(e) if kind == EngineKind::Uring => {
                eprintln!("io_uring unavailable, skipping: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let name = s.write_engine_name().unwrap();
        if kind == EngineKind::Pread {
            assert_eq!(name, "pread");
        } else {
            assert_eq!(name, "io_uring");
        }
        let head = s.allocate(40).unwrap();
        let tail = s.allocate(60).unwrap();
        // Blocks 45.., then 0..40 (two runs: 32 + 8), then 41..45.
        let mut blocks: Vec<u32> = tail[5..10].to_vec();
        blocks.extend_from_slice(&head);
        blocks.extend_from_slice(&tail[1..5]);
        assert_eq!(runs(&blocks).len(), 4);
        let stream: Vec<u8> = (0..blocks.len() * PAYLOAD - 100)
            .map(|i| (i * 31 % 253) as u8)
            .collect();
        s.write(9, 0, &blocks, &stream).unwrap();
        let r = PostingRef {
            blocks: blocks.clone(),
            count: 0,
        };
        let back = s.read(9, &r).unwrap();
        assert_eq!(&back[..stream.len()], &stream[..]);
        assert!(back[stream.len()..].iter().all(|&b| b == 0));
        assert_eq!(
            s.read_block(9, 6, blocks[6]).unwrap(),
            &stream[6 * PAYLOAD..7 * PAYLOAD]
        );
        // A partial rewrite from index 3 on (an append's shape).
        let fresh = s.allocate(2).unwrap();
        let tail_stream = vec![0xEEu8; PAYLOAD + 10];
        s.write(9, 3, &fresh, &tail_stream).unwrap();
        assert_eq!(&s.read_block(9, 4, fresh[1]).unwrap()[..10], &[0xEE; 10]);
        // The wrong posting or index is caught by the block header.
        assert!(s.read_block(8, 6, blocks[6]).is_err());
        s.sync().unwrap();
        let k = s.write_counters();
        assert_eq!((k.writes, k.completed, k.errors), (5, 5, 0), "{name}");
        assert_eq!(k.bytes_written, (blocks.len() + 2) as u64 * BLOCK as u64);
        assert_eq!(k.reads, 0);
        // Reopened (as after a checkpoint), the blocks are still there.
        drop(s);
        let s = Store::open_with_io(&path, 100, vec![], kind).unwrap();
        assert_eq!(&s.read(9, &r).unwrap()[..stream.len()], &stream[..]);
        // Many postings at once, more runs than the engine's depth (every
        // other block of 100 new ones: 50 runs): each stream as read alone.
        let more = s.allocate(100).unwrap();
        let b7: Vec<u32> = more.iter().copied().step_by(2).collect();
        let s7: Vec<u8> = (0..b7.len() * PAYLOAD).map(|i| (i % 251) as u8).collect();
        s.write(7, 0, &b7, &s7).unwrap();
        let r7 = PostingRef {
            blocks: b7,
            count: 0,
        };
        let got = s.read_many(&[(9, &r), (7, &r7)]).unwrap();
        assert_eq!(got[0], s.read(9, &r).unwrap());
        assert_eq!(got[1], s7);
        // A block under the wrong posting's name is caught.
        assert!(s.read_many(&[(9, &r), (8, &r7)]).is_err());
    }

    #[test]
    fn multi_run_write_through_pread() {
        multi_run_write(EngineKind::Pread);
    }

    #[test]
    fn multi_run_write_through_uring() {
        multi_run_write(EngineKind::Uring);
    }

    #[test]
    fn concurrent_writers_take_their_own_engines() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::create_with_io(&dir.path().join("p.dat"), EngineKind::Pread).unwrap();
        let postings: Vec<(u32, Vec<u32>, Vec<u8>)> = (0..8u32)
            .map(|p| {
                let blocks = s.allocate(3).unwrap();
                (p, blocks, vec![p as u8 + 1; 2 * PAYLOAD + 7])
            })
            .collect();
        std::thread::scope(|sc| {
            for (p, blocks, stream) in &postings {
                let s = &s;
                sc.spawn(move || s.write(*p, 0, blocks, stream).unwrap());
            }
        });
        for (p, blocks, stream) in &postings {
            let r = PostingRef {
                blocks: blocks.clone(),
                count: 0,
            };
            assert_eq!(&s.read(*p, &r).unwrap()[..stream.len()], &stream[..]);
        }
        assert_eq!(s.write_counters().writes, 8);
    }

    #[test]
    fn default_kind_is_auto() {
        let dir = tempfile::tempdir().unwrap();
        // `Auto` resolves like the index's reads: `NEARLINE_IO`, else
        // io_uring, else pread.
        let s = Store::create(&dir.path().join("p.dat")).unwrap();
        assert_eq!(s.io(), EngineKind::Auto);
        assert!(["io_uring", "pread"].contains(&s.write_engine_name().unwrap()));
    }
}

#[derive(Debug, Default)]
struct Alloc {
    /// Reusable blocks.
    free: Vec<u32>,
    /// Released since the last checkpoint.
    pending: Vec<u32>,
    /// Released under an earlier checkpoint, kept for a reader that still
    /// uses it: `(generation they were released under, blocks)`.
    sealed: Vec<(u64, Vec<u32>)>,
    /// Blocks the file holds (the next block at the end).
    end: u32,
}

/// Write engines not in use, and the totals of those dropped.
struct Engines {
    idle: Vec<IoEngine>,
    /// Counters of engines dropped after a failed write.
    retired: IoCounters,
}

/// The postings file.
pub struct Store {
    path: PathBuf,
    /// Open read-write (O_DIRECT where the file system allows it); shared
    /// with the write engines.
    file: Arc<File>,
    direct: bool,
    /// Engine kind of the writes (`Auto` consults `NEARLINE_IO`).
    io: EngineKind,
    engines: Mutex<Engines>,
    alloc: Mutex<Alloc>,
    /// Opened read-only (a reader of an index another process writes):
    /// allocating and writing are refused.
    read_only: bool,
}

impl Store {
    /// Creates an empty postings file at `path`, written through an engine
    /// of kind `Auto` (`NEARLINE_IO`, else io_uring, else pread).
    pub fn create(path: &Path) -> Result<Store> {
        Self::create_with_io(path, EngineKind::Auto)
    }

    /// [`Store::create`] writing through an engine of kind `io` (pass the
    /// kind the index reads with).
    pub fn create_with_io(path: &Path, io: EngineKind) -> Result<Store> {
        if path.exists() {
            std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
        }
        let (file, direct) = open_direct_rw(path, true)?;
        Self::with_file(path, file, direct, io, Alloc::default())
    }

    /// Opens the postings file of a checkpoint that used `end` blocks and
    /// left `free` unused, written through an engine of kind `Auto`. A file
    /// shorter than `end` blocks is corrupt; a longer one holds blocks
    /// written after the checkpoint (a crash), which are reused.
    pub fn open(path: &Path, end: u32, free: Vec<u32>) -> Result<Store> {
        Self::open_with_io(path, end, free, EngineKind::Auto)
    }

    /// [`Store::open`] writing through an engine of kind `io` (pass the kind
    /// the index reads with).
    pub fn open_with_io(path: &Path, end: u32, free: Vec<u32>, io: EngineKind) -> Result<Store> {
        let (file, direct) = open_direct_rw(path, false)?;
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
        Self::with_file(
            path,
            file,
            direct,
            io,
            Alloc {
                free,
                end,
                ..Alloc::default()
            },
        )
    }

    /// Opens the postings file of a checkpoint that used `end` blocks for
    /// reading only: a reader beside the index's writer (or without write
    /// permission). `allocate` and `write` are refused.
    pub fn open_read_only(path: &Path, end: u32, io: EngineKind) -> Result<Store> {
        let (file, direct) = open_direct(path)?;
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
        let mut s = Self::with_file(
            path,
            file,
            direct,
            io,
            Alloc {
                end,
                ..Alloc::default()
            },
        )?;
        s.read_only = true;
        Ok(s)
    }

    /// A store over `file`; opens its first engine now, so an engine kind
    /// that cannot be set up is reported when the index opens.
    fn with_file(path: &Path, file: File, direct: bool, io: EngineKind, a: Alloc) -> Result<Store> {
        let file = Arc::new(file);
        let first = IoEngine::open(io, Arc::clone(&file), WRITE_DEPTH)?;
        Ok(Store {
            read_only: false,
            path: path.to_path_buf(),
            file,
            direct,
            io,
            engines: Mutex::new(Engines {
                idle: vec![first],
                retired: IoCounters::default(),
            }),
            alloc: Mutex::new(a),
        })
    }

    /// The engine kind writes were asked for (`Auto` resolves per engine).
    pub fn io(&self) -> EngineKind {
        self.io
    }

    /// Which engine writes (`"io_uring"`, `"pread"`, ...).
    pub fn write_engine_name(&self) -> Result<&'static str> {
        let e = self.take_engine()?;
        let name = e.name();
        self.put_engine(e);
        Ok(name)
    }

    /// Totals of every write engine's writes (reads go elsewhere); complete
    /// when no write is running.
    pub fn write_counters(&self) -> IoCounters {
        let g = self.engines();
        let mut k = g.retired;
        for e in &g.idle {
            k += e.counters();
        }
        k
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

    fn engines(&self) -> std::sync::MutexGuard<'_, Engines> {
        self.engines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle write engine, or a new one.
    fn take_engine(&self) -> Result<IoEngine> {
        if let Some(e) = self.engines().idle.pop() {
            return Ok(e);
        }
        IoEngine::open(self.io, Arc::clone(&self.file), WRITE_DEPTH)
    }

    /// Returns an engine with nothing in flight to the pool.
    fn put_engine(&self, e: IoEngine) {
        self.engines().idle.push(e);
    }

    /// `n` blocks for new data, consecutive (one read covers them): the
    /// first run of `n` free blocks, else new blocks at the end of the file.
    pub fn allocate(&self, n: usize) -> Result<Vec<u32>> {
        self.writable()?;
        let mut a = self.lock();
        if n == 0 {
            return Ok(Vec::new());
        }
        if n == 1 {
            // Most appends need one block: any free one, no scan.
            if let Some(b) = a.free.pop() {
                return Ok(vec![b]);
            }
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

    /// Pending blocks become free: call after a durable checkpoint that
    /// replaced generation `released_under`, with no search running that
    /// started before the blocks were released. Blocks released under a
    /// generation at or after `oldest_held` (the oldest checkpoint a reader
    /// still uses, if any) stay sealed until a later call.
    pub fn reclaim(&self, released_under: u64, oldest_held: Option<u64>) {
        let mut a = self.lock();
        let p = std::mem::take(&mut a.pending);
        if !p.is_empty() {
            a.sealed.push((released_under, p));
        }
        let (free, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut a.sealed)
            .into_iter()
            .partition(|(g, _)| oldest_held.is_none_or(|h| *g < h));
        a.sealed = keep;
        for (_, b) in free {
            a.free.extend(b);
        }
    }

    /// `(end, free ∪ pending ∪ sealed)`: what a checkpoint taken now
    /// records (the map it saves names none of the released blocks).
    pub fn snapshot(&self) -> (u32, Vec<u32>) {
        let a = self.lock();
        let mut f = a.free.clone();
        f.extend_from_slice(&a.pending);
        for (_, b) in &a.sealed {
            f.extend_from_slice(b);
        }
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

    /// `(blocks in the file, free, pending)`: pending counts the sealed
    /// blocks too.
    pub fn counts(&self) -> (u32, usize, usize) {
        let a = self.lock();
        let sealed: usize = a.sealed.iter().map(|(_, b)| b.len()).sum();
        (a.end, a.free.len(), a.pending.len() + sealed)
    }

    /// Writes the entry stream of posting `posting` into `blocks` (its
    /// blocks `first_index..` in order): one write per run of consecutive
    /// blocks, all submitted to a write engine at once, then every
    /// completion awaited. Returns once nothing of this call is in flight,
    /// with the first failure if any run failed (a short write is one).
    pub fn write(
        &self,
        posting: u32,
        first_index: u32,
        blocks: &[u32],
        stream: &[u8],
    ) -> Result<()> {
        self.writable()?;
        let runs = runs(blocks);
        if runs.is_empty() {
            return Ok(());
        }
        let mut engine = self.take_engine()?;
        let mut out = Vec::with_capacity(runs.len());
        match self.write_runs(&mut engine, posting, first_index, &runs, stream, &mut out) {
            Ok(()) => {
                self.put_engine(engine);
                Ok(())
            }
            Err(err) => {
                // Nothing of this write may still be in flight when the
                // caller gives its blocks back: drain, and retire the
                // engine (dropping one waits for whatever it still has).
                out.clear();
                let _ = engine.drain(&mut out);
                drop(out);
                self.engines().retired += engine.counters();
                drop(engine);
                Err(err)
            }
        }
    }

    /// Submits every run, waits for all, checks each completion.
    fn write_runs(
        &self,
        engine: &mut IoEngine,
        posting: u32,
        first_index: u32,
        runs: &[(u32, u32, u32)],
        stream: &[u8],
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        for (token, &(b0, i0, len)) in runs.iter().enumerate() {
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
            engine.submit_write(token as u64, b0 as u64 * BLOCK as u64, buf)?;
        }
        engine.drain(out)?;
        let mut done = 0usize;
        for c in out.iter() {
            let Some(&(b0, _, len)) = usize::try_from(c.token).ok().and_then(|t| runs.get(t))
            else {
                return Err(Error::Engine(format!(
                    "write engine returned unknown token {} for posting {posting}",
                    c.token
                )));
            };
            if let Err(e) = &c.result {
                return Err(Error::io(
                    &self.path,
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "writing blocks {b0}..{} of posting {posting}: {e}",
                            b0 as u64 + len as u64
                        ),
                    ),
                ));
            }
            done += 1;
        }
        if done != runs.len() {
            return Err(Error::Engine(format!(
                "write engine completed {done} of {} writes of posting {posting}",
                runs.len()
            )));
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
            decode_run(
                &self.path,
                posting,
                (b0, i0, len),
                &buf.as_slice()[..got],
                &mut stream,
            )?;
        }
        Ok(stream)
    }

    /// Reads several postings' whole entry streams with every read in
    /// flight at once (up to the engine's depth) through an I/O engine:
    /// LIRE scans the postings around a split this way. Streams come back
    /// in the order of `items`.
    pub fn read_many(&self, items: &[(u32, &PostingRef)]) -> Result<Vec<Vec<u8>>> {
        // (item, first block, its index in the posting, blocks)
        let reqs: Vec<(usize, u32, u32, u32)> = items
            .iter()
            .enumerate()
            .flat_map(|(k, (_, r))| {
                runs(&r.blocks)
                    .into_iter()
                    .map(move |(b0, i0, len)| (k, b0, i0, len))
            })
            .collect();
        let mut got: Vec<Option<Completion>> = (0..reqs.len()).map(|_| None).collect();
        let mut engine = self.take_engine()?;
        let mut out = Vec::new();
        let res = (|| -> Result<()> {
            let (mut next, mut done) = (0usize, 0usize);
            while done < reqs.len() {
                while next < reqs.len() && engine.in_flight() < WRITE_DEPTH as usize {
                    let (_, b0, _, len) = reqs[next];
                    let buf = AlignedBuf::new(len as usize * BLOCK);
                    engine.submit(next as u64, b0 as u64 * BLOCK as u64, buf)?;
                    next += 1;
                }
                engine.flush()?;
                out.clear();
                engine.wait(1, &mut out)?;
                for c in out.drain(..) {
                    let slot = usize::try_from(c.token)
                        .ok()
                        .and_then(|t| got.get_mut(t))
                        .ok_or_else(|| {
                            Error::Engine(format!("read engine returned unknown token {}", c.token))
                        })?;
                    *slot = Some(c);
                    done += 1;
                }
            }
            Ok(())
        })();
        if res.is_err() {
            // Nothing may stay in flight into buffers about to be dropped:
            // drain, and retire the engine.
            let _ = engine.drain(&mut out);
        } else {
            self.put_engine(engine);
        }
        res?;
        let mut streams: Vec<Vec<u8>> = items
            .iter()
            .map(|(_, r)| Vec::with_capacity(r.blocks.len() * PAYLOAD))
            .collect();
        for (t, &(k, b0, i0, len)) in reqs.iter().enumerate() {
            let c = got[t]
                .take()
                .ok_or_else(|| Error::Engine("a read never completed".into()))?;
            let data = match &c.result {
                Ok(_) => c.filled().unwrap_or(&[]),
                Err(e) => {
                    return Err(Error::io(
                        &self.path,
                        std::io::Error::new(e.kind(), e.to_string()),
                    ))
                }
            };
            decode_run(&self.path, items[k].0, (b0, i0, len), data, &mut streams[k])?;
        }
        Ok(streams)
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

    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::arg(format!(
                "{} is open read-only: it takes no writes",
                self.path.display()
            )));
        }
        Ok(())
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
