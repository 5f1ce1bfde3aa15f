//! Fuzz target `shim_account`: see `fgpu_fuzz_targets::shim_account`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::shim_account(data));
