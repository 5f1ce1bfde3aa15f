//! Fuzz target `quantity`: see `fgpu_fuzz_targets::quantity`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::quantity(data));
