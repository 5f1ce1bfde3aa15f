//! Fuzz target `admission_review`: see `fgpu_fuzz_targets::admission_review`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::admission_review(data));
