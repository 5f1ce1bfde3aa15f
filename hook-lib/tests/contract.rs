//! The kubelet plugin creates the claim's accounts before any shim runs, at sizes it takes
//! from `fgpu_api::names::contract`; a shim in claim mode refuses an account whose size is
//! not exactly its own layout's. These must agree, or every claim refuses allocations.

use fgpu_api::names::contract;

#[test]
fn the_plugin_creates_the_accounts_at_the_sizes_the_shim_maps() {
    assert_eq!(contract::MEMORY_ACCOUNT_SIZE, fgpu::state::FILE_SIZE as u64);
    assert_eq!(contract::CORE_ACCOUNT_SIZE, fgpu::core::FILE_SIZE as u64);
    assert_eq!(contract::MAX_DEVICES, fgpu::config::MAX_DEVICES as u64);
}

#[test]
fn the_plugin_reads_account_uuids_as_the_shim_writes_them() {
    // The shim links libc only, so it keeps its own formatter; the plugin reads the
    // accounts' UUID bytes back with the API's. They must agree.
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(0x0f);
    }
    assert_eq!(fgpu::claims::uuid_string(&u), contract::gpu_uuid_string(&u));
    assert_eq!(
        contract::gpu_uuid_string(&[0xab; 16]),
        "GPU-abababab-abab-abab-abab-abababababab"
    );
}
