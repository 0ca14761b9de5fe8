#![no_main]
//! See `nearline_fuzz::wal` for what this target covers and its input.
libfuzzer_sys::fuzz_target!(|data: &[u8]| nearline_fuzz::wal(data));
