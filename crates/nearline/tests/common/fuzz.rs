//! The byte-mutation harness the fuzz tests share: an allocation guard
//! (the largest single allocation a reader asks for), [`run`] (one reader
//! call: no panic, a clean error kind, no huge allocation, no slow call),
//! and the mutations applied to valid encodings.

#![allow(dead_code)]

use nearline::Error;
use proptest::prelude::*;
use proptest::sample::Index as Pick;
use proptest::test_runner::TestCaseError;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Allocation guard: the largest single allocation a reader asks for on the
// calling thread. A reader that sizes a buffer from a header before checking
// the header against the input would show up here (or, for a request too big
// to be served, abort the run with the reader named).

/// Delegates to the system allocator and records request sizes.
pub struct Watch;

thread_local! {
    /// Largest request since the guard was armed (0: disarmed).
    static BIGGEST: Cell<usize> = const { Cell::new(0) };
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static READER: Cell<&'static str> = const { Cell::new("") };
    /// Where the last panic under [`run`] happened.
    static PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Panics under [`run`] are expected findings: keep their location for the
/// failure message instead of printing each one (proptest repeats them
/// while shrinking). Other panics print as usual.
pub fn quiet_panics_under_run() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if ARMED.with(|a| a.get()) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                PANIC_AT.with(|p| *p.borrow_mut() = at);
            } else {
                default(info);
            }
        }));
    });
}

/// Requests above this while armed abort the run (they cannot come from a
/// well-behaved reader given a small input, and may not be servable).
pub const HARD_LIMIT: usize = 1 << 30;

pub fn note(size: usize) {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = BIGGEST.try_with(|b| b.set(b.get().max(size)));
            if size > HARD_LIMIT {
                let name = READER.try_with(|r| r.get()).unwrap_or("?");
                eprintln!("fuzz_readers: reader {name} asked for a {size}-byte allocation");
                std::process::abort();
            }
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; `note` only reads
// and writes thread-local cells (allocation-free) before forwarding.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
pub static WATCH: Watch = Watch;

// ---------------------------------------------------------------------------
// Running one reader call

pub fn hex(b: &[u8]) -> String {
    const MAX: usize = 4096;
    let mut s: String = b.iter().take(MAX).map(|x| format!("{x:02x}")).collect();
    if b.len() > MAX {
        s.push_str(&format!("... ({} bytes in all)", b.len()));
    }
    s
}

pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Whether `e` is an error a reader may return for a bad input.
pub fn clean(e: &Error, allow_engine: bool) -> bool {
    match e {
        Error::Format { .. }
        | Error::Corrupt { .. }
        | Error::InvalidArgument(_)
        | Error::Version { .. }
        | Error::Io { .. } => true,
        Error::Engine(_) => allow_engine,
        Error::Cancelled => false,
    }
}

/// Collects every error a harness gets, so each is checked.
#[derive(Default)]
pub struct Sink {
    pub errors: Vec<Error>,
}

impl Sink {
    pub fn take<T>(&mut self, r: nearline::Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.push(e);
                None
            }
        }
    }
}

pub struct Limits {
    /// Largest single allocation allowed (bytes).
    pub alloc: usize,
    pub allow_engine: bool,
    pub time: Duration,
}

impl Limits {
    /// For a reader of `len` input bytes.
    pub fn small(len: usize) -> Self {
        Limits {
            alloc: (16 << 20) + 64 * len,
            allow_engine: false,
            time: Duration::from_secs(10),
        }
    }
}

/// Runs `f` on `input` and fails the case on a panic, an unexpected error
/// kind, a huge allocation or a slow call.
pub fn run(
    what: &'static str,
    input: &[u8],
    limits: Limits,
    f: impl FnOnce(&mut Sink),
) -> Result<(), TestCaseError> {
    quiet_panics_under_run();
    let mut sink = Sink::default();
    READER.with(|r| r.set(what));
    BIGGEST.with(|b| b.set(0));
    ARMED.with(|a| a.set(true));
    let t = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| f(&mut sink)));
    let took = t.elapsed();
    ARMED.with(|a| a.set(false));
    let biggest = BIGGEST.with(|b| b.get());
    if let Err(p) = outcome {
        let at = PANIC_AT.with(|a| a.borrow().clone());
        return Err(TestCaseError::fail(format!(
            "{what} panicked at {at} ({}) on a {}-byte input: {}",
            panic_text(&*p),
            input.len(),
            hex(input)
        )));
    }
    if let Some(e) = sink.errors.iter().find(|e| !clean(e, limits.allow_engine)) {
        return Err(TestCaseError::fail(format!(
            "{what} returned an unexpected error kind ({e:?}) on {}",
            hex(input)
        )));
    }
    if biggest > limits.alloc {
        return Err(TestCaseError::fail(format!(
            "{what} allocated {biggest} bytes at once (limit {}) on a {}-byte input: {}",
            limits.alloc,
            input.len(),
            hex(input)
        )));
    }
    if took > limits.time {
        return Err(TestCaseError::fail(format!(
            "{what} took {took:?} on a {}-byte input: {}",
            input.len(),
            hex(input)
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Mutations

/// Where a mutation writes: anywhere, or one of the first sixteen 4-byte
/// slots (where the headers are).
#[derive(Debug, Clone)]
pub enum Pos {
    Any(Pick),
    Header(u8),
}

impl Pos {
    pub fn at(&self, len: usize) -> usize {
        match self {
            Pos::Any(p) => {
                if len == 0 {
                    0
                } else {
                    p.index(len)
                }
            }
            Pos::Header(s) => (*s as usize % 16) * 4,
        }
    }
}

#[derive(Debug, Clone)]
pub enum Mutation {
    /// XOR one byte.
    Flip(Pos, u8),
    /// Overwrite a little-endian field of 1, 2, 4 or 8 bytes.
    Field(Pos, u64, u8),
    Truncate(Pick),
    Extend(Vec<u8>),
    Insert(Pos, Vec<u8>),
    Remove(Pos, usize),
    /// Copy a piece of the input over another place in it.
    Splice(Pick, Pos, usize),
}

pub fn extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => prop::sample::select(vec![
            0u64,
            1,
            2,
            3,
            4,
            7,
            8,
            16,
            127,
            128,
            255,
            256,
            4095,
            4096,
            65535,
            65536,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_fffe,
            0xffff_ffff,
            1 << 32,
            1 << 40,
            i64::MAX as u64,
            i64::MIN as u64,
            u64::MAX,
            f32::NAN.to_bits() as u64,
            f32::INFINITY.to_bits() as u64,
        ]),
        1 => 0u64..2048,
        1 => any::<u64>(),
    ]
}

pub fn pos() -> impl Strategy<Value = Pos> {
    prop_oneof![
        2 => any::<Pick>().prop_map(Pos::Any),
        1 => any::<u8>().prop_map(Pos::Header),
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (pos(), 1u8..=255).prop_map(|(p, x)| Mutation::Flip(p, x)),
        4 => (pos(), extreme(), prop::sample::select(vec![1u8, 2, 4, 8]))
            .prop_map(|(p, v, w)| Mutation::Field(p, v, w)),
        1 => any::<Pick>().prop_map(Mutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
        1 => (pos(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(p, b)| Mutation::Insert(p, b)),
        1 => (pos(), 1usize..64).prop_map(|(p, n)| Mutation::Remove(p, n)),
        1 => (any::<Pick>(), pos(), 1usize..64).prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
    ]
}

pub fn mutations(max: usize) -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 0..=max)
}

pub fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let len = b.len();
        match m {
            Mutation::Flip(p, x) => {
                let at = p.at(len);
                if at < len {
                    b[at] ^= x;
                }
            }
            Mutation::Field(p, v, w) => {
                let at = p.at(len);
                for (i, byte) in v.to_le_bytes().iter().take(*w as usize).enumerate() {
                    if let Some(slot) = b.get_mut(at + i) {
                        *slot = *byte;
                    }
                }
            }
            Mutation::Truncate(p) => {
                let at = if len == 0 { 0 } else { p.index(len) };
                b.truncate(at);
            }
            Mutation::Extend(x) => b.extend_from_slice(x),
            Mutation::Insert(p, x) => {
                let at = p.at(len).min(len);
                b.splice(at..at, x.iter().copied());
            }
            Mutation::Remove(p, n) => {
                let at = p.at(len).min(len);
                let end = (at + n).min(len);
                b.drain(at..end);
            }
            Mutation::Splice(from, to, n) => {
                if len > 0 {
                    let a = from.index(len);
                    let piece: Vec<u8> = b[a..(a + n).min(len)].to_vec();
                    let at = to.at(len).min(len);
                    for (i, x) in piece.into_iter().enumerate() {
                        if let Some(slot) = b.get_mut(at + i) {
                            *slot = x;
                        }
                    }
                }
            }
        }
    }
    b
}

pub fn cases(base: u32) -> u32 {
    let scale = std::env::var("NEARLINE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    base.saturating_mul(scale)
}

pub fn config(base: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(base),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
