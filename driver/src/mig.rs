//! Multi-Instance GPU: NVIDIA's profile tables, the free state of a GPU in MIG mode, the
//! choice of a profile and placement for a request, and the GPU as DRA partitionable
//! devices.
//!
//! * [`profiles`]: the profile tables (A100 40/80 GB, A30, H100 80 GB, H200 141 GB, B200),
//!   from NVIDIA's MIG user guide, and the lookup of a GPU's table by product and memory.
//! * [`layout`]: which placements of a GPU are taken, and whether another fits.
//! * [`choose`](mod@choose): the smallest fitting profile and the placement that keeps the large
//!   profiles possible, on one GPU or across several, optionally among allowed
//!   placements; the legacy path's mapping of a request in MiB to a profile.
//! * [`devices`]: the counter set and placement devices a MIG-mode GPU is published as, and
//!   their names (made and taken apart).
//!
//! [`MigInstance`] is what a backend reports of an instance it created. The rules and the
//! sources are in `docs/mig.md`.

pub mod choose;
pub mod devices;
pub mod layout;
pub mod profiles;

use serde::{Deserialize, Serialize};

pub use choose::{
    MigChoice, MigRequest, choose, choose_across, choose_across_where, choose_where, place,
    place_where, profile_for_mib,
};
pub use devices::{
    CounterSet, DeviceName, MigDevices, PlacementDevice, device_name, mig_devices,
    parse_device_name,
};
pub use layout::{FreeScore, MigError, MigLayout};
pub use profiles::{
    MigProfile, MigTable, Placement, UnknownModel, table_for, tables_with_profiles,
};

use crate::device::DeviceNode;

/// A MIG instance (a GPU instance with one compute instance spanning it) on a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigInstance {
    /// The instance's UUID, `MIG-` followed by hex digits and dashes.
    pub uuid: String,
    /// The parent GPU's UUID.
    pub gpu_uuid: String,
    /// The profile, e.g. `1g.10gb`.
    pub profile: String,
    /// Where it sits.
    pub placement: Placement,
    /// The GPU instance id.
    pub gi_id: u32,
    /// The compute instance id within the GPU instance.
    pub ci_id: u32,
    /// Its memory in bytes (the profile's).
    pub memory_bytes: u64,
    /// The device nodes a container needs for it: the parent GPU's node, then the GPU
    /// instance's and compute instance's capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`).
    pub device_nodes: Vec<DeviceNode>,
}

/// The [`MigLayout`] of a GPU of model `table` holding `instances`.
pub fn layout_of<'a>(
    table: &'static MigTable,
    instances: impl IntoIterator<Item = &'a MigInstance>,
) -> Result<MigLayout, MigError> {
    MigLayout::with_instances(
        table,
        instances
            .into_iter()
            .map(|i| (i.profile.as_str(), i.placement.start)),
    )
}
