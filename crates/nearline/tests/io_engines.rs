//! The I/O engines behind one contract: every engine (io_uring, pread, fake)
//! reads back known pages, returns each read exactly once with its own buffer,
//! reports short reads at end of file and survives being dropped mid-flight.

use nearline::io::{open_direct, AlignedBuf, Completion, EngineKind, FakeOptions, IoEngine, ALIGN};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

/// Byte `i` of page `p`: distinct across pages and positions.
fn pattern(p: u64, i: usize) -> u8 {
    (p.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64 * 31) >> 3) as u8
}

fn page_bytes(pages: u64, tail: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(pages as usize * ALIGN + tail);
    for p in 0..pages {
        v.extend((0..ALIGN).map(|i| pattern(p, i)));
    }
    v.extend((0..tail).map(|i| pattern(pages, i)));
    v
}

struct Fixture {
    _tmp: tempfile::NamedTempFile,
    file: Arc<std::fs::File>,
    data: Arc<Vec<u8>>,
    direct: bool,
}

fn fixture(pages: u64, tail: usize) -> Fixture {
    let data = page_bytes(pages, tail);
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    tmp.write_all(&data).unwrap();
    tmp.flush().unwrap();
    let (file, direct) = open_direct(tmp.path()).unwrap();
    Fixture {
        _tmp: tmp,
        file: Arc::new(file),
        data: Arc::new(data),
        direct,
    }
}

/// Every engine this machine can run, reading the fixture's file.
fn engines(fx: &Fixture, depth: u32) -> Vec<IoEngine> {
    let mut v = Vec::new();
    for kind in [EngineKind::Uring, EngineKind::UringPoll] {
        match IoEngine::open_resolved(kind, Arc::clone(&fx.file), depth) {
            Ok(e) => v.push(e),
            Err(e) => eprintln!("skipping {kind:?}: {e}"),
        }
    }
    v.push(IoEngine::open_resolved(EngineKind::Pread, Arc::clone(&fx.file), depth).unwrap());
    v.push(IoEngine::fake(
        Arc::clone(&fx.data),
        FakeOptions {
            seed: 7,
            max_delay_polls: 3,
            strict_alignment: fx.direct,
            ..Default::default()
        },
    ));
    v
}

fn check_page(c: &Completion, data: &[u8], offset: u64) {
    let n = *c.result.as_ref().unwrap();
    let start = offset as usize;
    let expect = &data[start.min(data.len())..(start + c.buf.len()).min(data.len())];
    assert_eq!(n, expect.len(), "token {} length", c.token);
    assert_eq!(&c.buf.as_slice()[..n], expect, "token {} bytes", c.token);
}

#[test]
fn random_pages_read_back_through_every_engine() {
    let fx = fixture(64, 0);
    for mut e in engines(&fx, 8) {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut offsets = HashMap::new();
        let mut out = Vec::new();
        let mut seen = 0;
        for token in 0..200u64 {
            // Single pages and, now and then, two consecutive pages.
            let len = if rng.random_bool(0.2) {
                2 * ALIGN
            } else {
                ALIGN
            };
            let page = rng.random_range(0..63u64);
            let off = page * ALIGN as u64;
            offsets.insert(token, off);
            e.submit(token, off, AlignedBuf::new(len)).unwrap();
            if e.in_flight() >= 8 {
                e.wait(1, &mut out).unwrap();
            } else {
                e.poll(&mut out, 4).unwrap();
            }
            for c in out.drain(..) {
                check_page(&c, &fx.data, offsets.remove(&c.token).unwrap());
                seen += 1;
            }
        }
        e.drain(&mut out).unwrap();
        for c in out.drain(..) {
            check_page(&c, &fx.data, offsets.remove(&c.token).unwrap());
            seen += 1;
        }
        assert_eq!(seen, 200, "{}", e.name());
        assert!(offsets.is_empty(), "{}", e.name());
        assert_eq!(e.in_flight(), 0);
        let k = e.counters();
        assert_eq!(
            (k.reads, k.completed, k.errors),
            (200, 200, 0),
            "{}",
            e.name()
        );
    }
}

#[test]
fn more_reads_than_depth_each_come_back_once_with_own_buffer() {
    let fx = fixture(32, 0);
    for mut e in engines(&fx, 4) {
        let mut ptrs = HashMap::new();
        for token in 0..100u64 {
            let mut buf = AlignedBuf::new(ALIGN);
            ptrs.insert(token, buf.as_mut_ptr() as usize);
            e.submit(token, (token % 32) * ALIGN as u64, buf).unwrap();
        }
        assert_eq!(e.in_flight(), 100, "{}", e.name());
        let mut out = Vec::new();
        e.drain(&mut out).unwrap();
        assert_eq!(out.len(), 100, "{}", e.name());
        for mut c in out {
            let ptr = ptrs.remove(&c.token).expect("token completed twice");
            assert_eq!(
                c.buf.as_mut_ptr() as usize,
                ptr,
                "buffer of token {}",
                c.token
            );
            check_page(&c, &fx.data, (c.token % 32) * ALIGN as u64);
        }
        assert!(ptrs.is_empty());
        assert_eq!(e.in_flight(), 0);
    }
}

#[test]
fn short_read_at_end_of_file() {
    let fx = fixture(3, 100);
    for mut e in engines(&fx, 4) {
        let mut out = Vec::new();
        e.submit(1, 3 * ALIGN as u64, AlignedBuf::new(ALIGN))
            .unwrap();
        e.submit(2, 2 * ALIGN as u64, AlignedBuf::new(2 * ALIGN))
            .unwrap();
        e.submit(3, 8 * ALIGN as u64, AlignedBuf::new(ALIGN))
            .unwrap();
        e.wait(3, &mut out).unwrap();
        out.sort_by_key(|c| c.token);
        let got: Vec<usize> = out.iter().map(|c| *c.result.as_ref().unwrap()).collect();
        assert_eq!(got, vec![100, ALIGN + 100, 0], "{}", e.name());
        check_page(&out[0], &fx.data, 3 * ALIGN as u64);
        check_page(&out[1], &fx.data, 2 * ALIGN as u64);
    }
}

#[test]
fn misaligned_direct_read_reports_the_os_error() {
    let fx = fixture(4, 0);
    if !fx.direct {
        eprintln!("O_DIRECT not in effect on this file system: nothing to check");
        return;
    }
    for mut e in engines(&fx, 4) {
        let mut out = Vec::new();
        e.submit(9, 512 + 1, AlignedBuf::new(ALIGN)).unwrap();
        e.wait(1, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        let err = out[0].result.as_ref().unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EINVAL),
            "{}: {err}",
            e.name()
        );
        assert_eq!(e.counters().errors, 1);
    }
}

#[test]
fn drop_with_reads_in_flight() {
    let fx = fixture(64, 0);
    for mut e in engines(&fx, 16) {
        for token in 0..40u64 {
            e.submit(token, (token % 64) * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
        }
        // Some reads are pending in the SQ, some in the kernel, some reaped
        // into the ready queue; dropping must wait for all of them.
        let mut out = Vec::new();
        e.poll(&mut out, 2).unwrap();
        drop(e);
    }
}

#[test]
fn poll_with_nothing_in_flight_and_wait_zero() {
    let fx = fixture(2, 0);
    for mut e in engines(&fx, 2) {
        let mut out = Vec::new();
        assert_eq!(e.poll(&mut out, 8).unwrap(), 0);
        assert_eq!(e.wait(5, &mut out).unwrap(), 0);
        assert_eq!(e.drain(&mut out).unwrap(), 0);
        e.submit(0, 0, AlignedBuf::new(ALIGN)).unwrap();
        e.flush().unwrap();
        // wait(0) never blocks but still submits; poll until the read arrives.
        e.wait(0, &mut out).unwrap();
        while out.is_empty() {
            e.poll(&mut out, 8).unwrap();
        }
        check_page(&out[0], &fx.data, 0);
    }
}

#[test]
fn auto_picks_a_working_engine() {
    let fx = fixture(2, 0);
    let mut e = IoEngine::open_resolved(EngineKind::Auto, Arc::clone(&fx.file), 4).unwrap();
    assert!(e.name() == "io_uring" || e.name() == "pread");
    let mut out = Vec::new();
    e.submit(5, ALIGN as u64, AlignedBuf::new(ALIGN)).unwrap();
    e.wait(1, &mut out).unwrap();
    check_page(&out[0], &fx.data, ALIGN as u64);
}

/// Random 4 KiB reads per second through each engine at several queue depths
/// on a 1 GiB file. Run in release on a real disk:
/// `NEARLINE_BENCH_DIR=/work cargo test -p nearline --release --test io_engines -- --ignored --nocapture bench`
#[test]
#[ignore]
fn bench_random_4k_reads() {
    use nearline::io::uring::UringEngine;
    use std::time::{Duration, Instant};

    const SIZE: u64 = 1 << 30;
    const PAGES: u64 = SIZE / ALIGN as u64;
    let dir = std::env::var("NEARLINE_BENCH_DIR").unwrap_or_else(|_| ".".into());
    let path = std::path::Path::new(&dir).join("nearline-io-bench.bin");
    {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk: Vec<u8> = (0..(8 << 20))
            .map(|i: usize| ((i * 131) >> 5) as u8)
            .collect();
        for _ in 0..SIZE / chunk.len() as u64 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let (file, direct) = open_direct(&path).unwrap();
    let file = Arc::new(file);
    eprintln!("file {} direct={direct}", path.display());
    let secs = Duration::from_millis(1500);

    fn thread_cpu() -> f64 {
        // SAFETY: getrusage writes into the zeroed struct we own.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a rusage struct.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
    let run = |mut e: IoEngine, qd: usize, seed: u64| -> (f64, f64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::with_capacity(qd);
        let mut done = 0u64;
        for t in 0..qd as u64 {
            e.submit(
                t,
                rng.random_range(0..PAGES) * ALIGN as u64,
                AlignedBuf::new(ALIGN),
            )
            .unwrap();
        }
        let start = Instant::now();
        let cpu0 = thread_cpu();
        while start.elapsed() < secs {
            e.wait(1, &mut out).unwrap();
            for c in out.drain(..) {
                assert_eq!(*c.result.as_ref().unwrap(), ALIGN);
                done += 1;
                e.submit(c.token, rng.random_range(0..PAGES) * ALIGN as u64, c.buf)
                    .unwrap();
            }
        }
        let rate = done as f64 / start.elapsed().as_secs_f64();
        let cpu_us = (thread_cpu() - cpu0) * 1e6 / done as f64;
        e.drain(&mut out).unwrap();
        (rate, cpu_us)
    };

    // Two rounds, so that drift of a shared disk shows up in the figures.
    for round in 0..2 {
        eprintln!("round {round}");
        for qd in [1usize, 8, 32, 64] {
            for fixed in [true, false] {
                let e = IoEngine::Uring(
                    UringEngine::with_options(Arc::clone(&file), qd as u32, fixed).unwrap(),
                );
                let (rate, cpu) = run(e, qd, qd as u64);
                eprintln!(
                    "io_uring fixed_file={fixed} qd={qd}: {rate:.0} reads/s, {cpu:.2} us CPU/read"
                );
            }
        }
        for qd in [1usize, 8, 32] {
            // pread is synchronous: one engine is always at queue depth 1; depth
            // comes from threads (one engine per worker, as the search pool does).
            let total: f64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..qd)
                    .map(|i| {
                        let file = Arc::clone(&file);
                        s.spawn(move || {
                            run(
                                IoEngine::open_resolved(EngineKind::Pread, file, 1).unwrap(),
                                1,
                                100 + i as u64,
                            )
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap().0).sum()
            });
            eprintln!("pread threads={qd}: {total:.0} reads/s");
            if qd == 1 {
                let (_, cpu) = run(
                    IoEngine::open_resolved(EngineKind::Pread, Arc::clone(&file), 1).unwrap(),
                    1,
                    7,
                );
                eprintln!("pread qd=1: {cpu:.2} us CPU/read");
            }
        }
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn open_direct_works_on_tmpfs_and_disk() {
    let dirs: Vec<std::path::PathBuf> = [std::path::Path::new("/dev/shm"), &std::env::temp_dir()]
        .iter()
        .filter(|d| d.is_dir())
        .map(|d| d.to_path_buf())
        .collect();
    for dir in dirs {
        let Ok(mut tmp) = tempfile::NamedTempFile::new_in(&dir) else {
            continue;
        };
        let data = page_bytes(3, 7);
        tmp.write_all(&data).unwrap();
        tmp.flush().unwrap();
        // Whether O_DIRECT is honoured depends on the file system (tmpfs
        // refuses it before Linux 6.6); either way the file must be readable.
        let (file, direct) = open_direct(tmp.path()).unwrap();
        eprintln!("{}: O_DIRECT {direct}", dir.display());
        let mut e = IoEngine::open_resolved(EngineKind::Auto, Arc::new(file), 2).unwrap();
        let mut out = Vec::new();
        e.submit(0, 2 * ALIGN as u64, AlignedBuf::new(2 * ALIGN))
            .unwrap();
        e.wait(1, &mut out).unwrap();
        assert_eq!(out[0].filled().unwrap(), &data[2 * ALIGN..]);
    }
}
