//! Fuzz target `shim_feed`: see `fgpu_fuzz_targets::shim_feed`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::shim_feed(data));
