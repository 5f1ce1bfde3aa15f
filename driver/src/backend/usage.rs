//! What runs on a GPU, as the driver reports it: the node monitor's raw samples.
//!
//! Both backends answer through NVML (the `nvml` module's `device_usage`): the `nvml` backend with the
//! node's driver, the `fake` backend with the fake driver's NVML (`tests/fake-cuda`) when it
//! is given one, so that the monitor's code path is the same on a real and a fake node.

/// Where a backend without a driver of its own reads what runs on its GPUs: the fake
/// backend is given the fake driver's NVML this way (the `nvml` module's `NvmlUsage`), so that
/// it does not depend on the NVML module itself.
pub trait UsageReader: Send + Sync {
    /// The GPUs `uuids`, in that order, since `since_us` (see
    /// [`super::DeviceBackend::usage`]).
    fn usage_of(&self, uuids: &[String], since_us: u64) -> Vec<GpuUsage>;
}

/// One compute process on a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUsage {
    /// The PID as the driver reports it: the host's (the initial PID namespace's).
    pub pid: u32,
    /// Device memory the process holds, in bytes; `None` where the driver does not say.
    pub used_memory: Option<u64>,
    /// SM utilisation of the process over the window, in percent (0-100); `None` when the
    /// driver has no sample of it in the window.
    pub sm_percent: Option<u32>,
}

/// One GPU's processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuUsage {
    /// The GPU's UUID (`GPU-…`).
    pub uuid: String,
    /// Its compute processes; empty when none runs.
    pub processes: Vec<ProcessUsage>,
    /// Why this GPU could not be read (the others still are); `processes` is then empty.
    pub error: Option<String>,
    /// Why its utilisation samples could not be read (the process list still is); the
    /// processes then have no SM figure.
    pub sm_error: Option<String>,
}

impl GpuUsage {
    /// A GPU whose queries failed.
    pub fn failed(uuid: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            uuid: uuid.into(),
            processes: Vec::new(),
            error: Some(error.into()),
            sm_error: None,
        }
    }
}

/// Joins a GPU's process list with its utilisation samples (pid, SM %): every listed
/// process, with the SM figure of its newest sample; samples of processes no longer in
/// the list are dropped (they exited between the two calls).
pub fn join(processes: Vec<(u32, Option<u64>)>, samples: &[(u32, u64, u32)]) -> Vec<ProcessUsage> {
    processes
        .into_iter()
        .map(|(pid, used_memory)| ProcessUsage {
            pid,
            used_memory,
            sm_percent: samples
                .iter()
                .filter(|s| s.0 == pid)
                .max_by_key(|s| s.1)
                .map(|s| s.2.min(100)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_takes_the_newest_sample_and_drops_exited_processes() {
        let got = join(
            vec![(10, Some(1 << 20)), (11, None)],
            &[(10, 5, 30), (10, 9, 40), (12, 9, 99), (11, 3, 250)],
        );
        assert_eq!(
            got,
            vec![
                ProcessUsage {
                    pid: 10,
                    used_memory: Some(1 << 20),
                    sm_percent: Some(40)
                },
                ProcessUsage {
                    pid: 11,
                    used_memory: None,
                    sm_percent: Some(100)
                },
            ]
        );
        assert_eq!(join(vec![(7, Some(0))], &[])[0].sm_percent, None);
    }
}
