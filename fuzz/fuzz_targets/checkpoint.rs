//! Fuzz target `checkpoint`: see `fgpu_fuzz_targets::checkpoint`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::checkpoint(data));
