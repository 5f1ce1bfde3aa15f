//! Fuzz target `share_config`: see `fgpu_fuzz_targets::share_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::share_config(data));
