//! A process whose visible device is a MIG instance sees the instance's memory as the
//! device's total (`cuDeviceTotalMem`, `cuMemGetInfo`, NVML's memory info) and its `MIG-`
//! UUID, with the memory taken from the fake backend's MIG state file
//! (`FAKE_CUDA_MIG_STATE`), as the kubelet plugin's fake node sets it up.
//!
//! One test in this file: it sets the library's environment before the library is used.

use std::ffi::{CStr, c_char, c_int};

use fgpu_driver::backend::fake::mig_state_path;
use fgpu_driver::backend::{DeviceBackend, FakeBackend};
use fgpu_driver::mig::Placement;
use fgpu_fake_cuda as cu;

const H100: &str = "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff";
const GIB: u64 = 1 << 30;

#[test]
fn a_mig_uuid_sees_the_instances_memory_as_the_device_total() {
    let dir = std::env::temp_dir().join(format!("fgpu-fake-cuda-mig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("node.yaml");
    std::fs::write(
        &profile,
        format!(
            "nodes:\n  - name: n\n    gpus:\n      - uuid: {H100}\n        productName: NVIDIA H100 80GB HBM3\n        memory: 81559Mi\n        smCount: 132\n        computeCapability: \"9.0\"\n        migCapable: true\n        mode: mig\n"
        ),
    )
    .unwrap();
    let backend = FakeBackend::open(&profile, None).unwrap();
    let inst = backend
        .create_mig_instance(H100, "2g.20gb", Placement { start: 4, size: 2 })
        .unwrap();
    // The node's GPU first, the instance second; CUDA is shown only the instance.
    // SAFETY: the only test of this binary, before the library reads the environment.
    unsafe {
        std::env::set_var("FAKE_CUDA_UUIDS", format!("{H100},{}", inst.uuid));
        std::env::set_var("FAKE_CUDA_MIG_STATE", mig_state_path(&profile));
        std::env::set_var("CUDA_VISIBLE_DEVICES", &inst.uuid);
        std::env::remove_var("FAKE_CUDA_MEMORY");
        std::env::remove_var("FAKE_CUDA_MEMORY_0");
        std::env::remove_var("FAKE_CUDA_MEMORY_1");
        std::env::remove_var("FAKE_CUDA_GPUS");
        std::env::remove_var("FAKE_CUDA_STATE");
    }
    let ok = |what: &str, r: cu::CUresult| assert_eq!(r, cu::CUDA_SUCCESS, "{what}");

    // SAFETY: direct calls into the linked-in fake driver, with valid out-pointers.
    ok("cuInit", unsafe { cu::cuInit(0) });
    let mut n: c_int = 0;
    // SAFETY: as above.
    ok("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) });
    assert_eq!(n, 1, "CUDA_VISIBLE_DEVICES names only the instance");
    let mut total = 0usize;
    // SAFETY: as above.
    ok("cuDeviceTotalMem", unsafe {
        cu::cuDeviceTotalMem_v2(&mut total, 0)
    });
    assert_eq!(total as u64, 20 * GIB);
    assert_eq!(inst.memory_bytes, 20 * GIB);
    let mut ctx = 0usize;
    // SAFETY: as above.
    ok("cuCtxCreate", unsafe {
        cu::pools::cuCtxCreate_v2(&mut ctx, 0, 0)
    });
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: as above.
    ok("cuMemGetInfo", unsafe {
        cu::cuMemGetInfo_v2(&mut free, &mut total)
    });
    assert_eq!(total as u64, 20 * GIB);
    assert!(free as u64 <= 20 * GIB);

    // NVML is not filtered by CUDA_VISIBLE_DEVICES: the instance is its device 1.
    // SAFETY: as above.
    ok("nvmlInit", unsafe { cu::nvmlInit_v2() });
    let mut h: *const u8 = std::ptr::null();
    let mut mem = cu::NvmlMemory {
        total: 0,
        free: 0,
        used: 0,
    };
    let mut buf = [0 as c_char; 96];
    // SAFETY: as above; the buffer holds 96 bytes.
    unsafe {
        ok(
            "nvmlDeviceGetHandleByIndex",
            cu::nvmlDeviceGetHandleByIndex_v2(1, &mut h),
        );
        ok(
            "nvmlDeviceGetMemoryInfo",
            cu::nvmlDeviceGetMemoryInfo(h, &mut mem),
        );
        ok(
            "nvmlDeviceGetUUID",
            cu::nvmlDeviceGetUUID(h, buf.as_mut_ptr(), 96),
        );
    }
    assert_eq!(mem.total, 20 * GIB);
    // SAFETY: NUL-terminated by nvmlDeviceGetUUID.
    let uuid = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert_eq!(uuid.to_ascii_lowercase(), inst.uuid.to_ascii_lowercase());
    // The parent stays the whole GPU.
    // SAFETY: as above.
    unsafe {
        ok(
            "nvmlDeviceGetHandleByIndex",
            cu::nvmlDeviceGetHandleByIndex_v2(0, &mut h),
        );
        ok(
            "nvmlDeviceGetMemoryInfo",
            cu::nvmlDeviceGetMemoryInfo(h, &mut mem),
        );
    }
    assert_eq!(mem.total, 80 * GIB);
    let _ = std::fs::remove_dir_all(&dir);
}
