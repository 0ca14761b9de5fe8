#![no_main]
//! See `nearline_fuzz::adjacency` for what this target covers and its input.
libfuzzer_sys::fuzz_target!(|data: &[u8]| nearline_fuzz::adjacency(data));
