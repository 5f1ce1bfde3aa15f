//! Fuzz target `extender_request`: see `fgpu_fuzz_targets::extender_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::extender_request(data));
