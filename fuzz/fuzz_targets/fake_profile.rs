//! Fuzz target `fake_profile`: see `fgpu_fuzz_targets::fake_profile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::fake_profile(data));
