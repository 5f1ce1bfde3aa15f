//! Fuzz target `assignment`: see `fgpu_fuzz_targets::assignment`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::assignment(data));
