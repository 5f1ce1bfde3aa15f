//! Fuzz target `shim_limits`: see `fgpu_fuzz_targets::shim_limits`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::shim_limits(data));
