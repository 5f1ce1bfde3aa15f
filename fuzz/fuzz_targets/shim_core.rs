//! Fuzz target `shim_core`: see `fgpu_fuzz_targets::shim_core`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::shim_core(data));
