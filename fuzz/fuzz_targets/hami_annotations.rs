//! Fuzz target `hami_annotations`: see `fgpu_fuzz_targets::hami_annotations`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fgpu_fuzz_targets::hami_annotations(data));
