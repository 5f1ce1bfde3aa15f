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
