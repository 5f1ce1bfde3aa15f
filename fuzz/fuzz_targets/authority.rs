//! Fuzz target `authority`: see `fgpu_fuzz_targets::authority`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::authority(data));
