//! What the daemon's loop and its servers share: the effective [`Mode`] and the
//! [`Shared`] state (client, version, metrics, readiness).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use fgpu_api::names::DriverName;

use crate::ApiVersion;
use crate::metrics::Metrics;

/// How the controller takes part in allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// `capacity` when the cluster has consumable capacity, else `controller`.
    Auto,
    /// Allocate claims of the shared class for gated pods.
    Controller,
    /// kube-scheduler allocates; only serve webhooks and metrics, lift gates.
    Capacity,
}

impl Mode {
    /// The name, as logs and metrics show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Controller => "controller",
            Self::Capacity => "capacity",
        }
    }
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Controller,
            2 => Self::Capacity,
            _ => Self::Auto,
        }
    }
    fn to_u8(self) -> u8 {
        match self {
            Self::Auto => 0,
            Self::Controller => 1,
            Self::Capacity => 2,
        }
    }
}

/// The effective mode, shared between the loop and the webhooks.
#[derive(Debug, Default)]
pub struct ModeCell(AtomicU8);

impl ModeCell {
    /// The mode in force (`Auto` until the first pass decided).
    pub fn get(&self) -> Mode {
        Mode::from_u8(self.0.load(Ordering::Relaxed))
    }
    pub(crate) fn set(&self, m: Mode) {
        self.0.store(m.to_u8(), Ordering::Relaxed);
    }
}

/// What the servers share with the loop.
pub struct Shared {
    pub driver: DriverName,
    pub api: ApiVersion,
    pub client: kube::Client,
    pub mode: ModeCell,
    pub metrics: Metrics,
    /// HAMi's scheduler families, with `--hami-metrics`.
    pub hami: Option<crate::hami_metrics::HamiMetrics>,
    /// All reflectors have listed once.
    pub ready: AtomicBool,
    /// `--hami-pods`: serve `/mutate-pods-dra` ([`crate::hami_pods`]).
    pub hami_pods: bool,
}

#[cfg(test)]
impl Shared {
    /// What a test's servers and loop share over `client`: the default driver,
    /// `resource.k8s.io/v1`, no HAMi families, `--hami-pods` off, caches ready.
    pub(crate) fn for_tests(client: kube::Client) -> Self {
        Self {
            driver: DriverName::default(),
            api: ApiVersion::V1,
            client,
            mode: ModeCell::default(),
            metrics: Metrics::new(),
            hami: None,
            ready: AtomicBool::new(true),
            hami_pods: false,
        }
    }
}
