//! What one allocation result of fgpu grants: memory, cores, priority, oversubscription.
//!
//! The one rule that both sides of a claim must agree on, the node (which enforces the
//! grant) and the controller (which accounts for it in the ledger). Pure: the callers
//! decode the claim; this merges what they decoded. Per field, the first that says
//! something wins:
//!
//! 1. memory and cores: the result's `consumedCapacity`;
//! 2. this driver's `GpuShareConfig` entries that apply to the result's request, class
//!    entries before claim entries ([`order`]), later entries winning field by field;
//! 3. nothing: [`Source::WholeDevice`], and the caller decides what that means (the node:
//!    all memory, cores not throttled; the ledger: the whole device is taken).

use fgpu_api::config::{CorePercent, GpuShareConfig, Priority};

/// Where a field's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The result's `consumedCapacity`.
    ConsumedCapacity,
    /// This driver's opaque configuration.
    Config,
    /// Nothing said it.
    WholeDevice,
}

/// One decoded configuration entry of this driver in `status.allocation.devices.config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    /// `source: FromClass`.
    pub from_class: bool,
    /// Index in `status.allocation.devices.config`.
    pub position: usize,
    /// `requests`; empty applies to every request.
    pub requests: Vec<String>,
    pub config: GpuShareConfig,
    /// Whether `priority` / `oversubscribe` were written (their defaults must not
    /// override an earlier entry).
    pub has_priority: bool,
    pub has_oversubscribe: bool,
}

impl ConfigEntry {
    /// Whether the entry applies to `request` (`<req>` or `<req>/<sub>`; an entry naming
    /// `<req>` applies to its subrequests).
    pub fn applies_to(&self, request: &str) -> bool {
        let parent = request.split_once('/').map_or(request, |(p, _)| p);
        self.requests.is_empty() || self.requests.iter().any(|r| r == request || r == parent)
    }
}

/// Puts entries in precedence order: class entries first, then claim entries, each in the
/// allocator's order.
pub fn order(entries: &mut [ConfigEntry]) {
    entries.sort_by_key(|e| (!e.from_class, e.position));
}

/// The decoded `consumedCapacity` of a result (`None`: that capacity is not listed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Consumed {
    pub memory: Option<u64>,
    pub cores: Option<CorePercent>,
}

/// What a result grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareGrant {
    /// Bytes of device memory; `None`: nothing said (see [`Source::WholeDevice`]).
    pub memory: Option<u64>,
    pub memory_source: Source,
    /// Percent of the SMs; `None`: nothing said.
    pub cores: Option<CorePercent>,
    pub cores_source: Source,
    /// The entry (its `position`) that set memory, when the config did.
    pub memory_entry: Option<usize>,
    pub priority: Priority,
    pub oversubscribe: bool,
}

impl ShareGrant {
    /// Neither memory nor cores were said by anything.
    pub fn is_whole_device(&self) -> bool {
        self.memory_source == Source::WholeDevice && self.cores_source == Source::WholeDevice
    }
}

/// Resolves the grant of a result of `request` from `entries` (in [`order`]; entries that
/// do not apply are skipped) and its `consumed` capacity.
pub fn resolve(entries: &[ConfigEntry], request: &str, consumed: Option<Consumed>) -> ShareGrant {
    let mut g = ShareGrant {
        memory: None,
        memory_source: Source::WholeDevice,
        cores: None,
        cores_source: Source::WholeDevice,
        memory_entry: None,
        priority: Priority::Normal,
        oversubscribe: false,
    };
    for e in entries.iter().filter(|e| e.applies_to(request)) {
        if let Some(m) = e.config.memory {
            (g.memory, g.memory_source, g.memory_entry) =
                (Some(m), Source::Config, Some(e.position));
        }
        if let Some(c) = e.config.cores {
            (g.cores, g.cores_source) = (Some(c), Source::Config);
        }
        if e.has_priority {
            g.priority = e.config.priority;
        }
        if e.has_oversubscribe {
            g.oversubscribe = e.config.oversubscribe;
        }
    }
    if let Some(c) = consumed {
        if let Some(m) = c.memory {
            (g.memory, g.memory_source) = (Some(m), Source::ConsumedCapacity);
        }
        if let Some(cores) = c.cores {
            (g.cores, g.cores_source) = (Some(cores), Source::ConsumedCapacity);
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        from_class: bool,
        position: usize,
        requests: &[&str],
        memory: Option<u64>,
        cores: Option<u8>,
    ) -> ConfigEntry {
        ConfigEntry {
            from_class,
            position,
            requests: requests.iter().map(|r| r.to_string()).collect(),
            config: GpuShareConfig {
                memory,
                cores: cores.and_then(CorePercent::new),
                priority: Priority::High,
                ..Default::default()
            },
            has_priority: position == 0,
            has_oversubscribe: false,
        }
    }

    #[test]
    fn precedence_table() {
        use Source::*;
        let consumed = Consumed {
            memory: Some(20),
            cores: CorePercent::new(25),
        };
        let memory_only = Consumed {
            memory: Some(7),
            cores: None,
        };
        type Want = (Option<u64>, Source, Option<u8>, Source);
        type Case<'a> = (&'a str, Vec<ConfigEntry>, &'a str, Option<Consumed>, Want);
        let cases: Vec<Case<'_>> = vec![
            (
                "nothing",
                vec![],
                "gpu",
                None,
                (None, WholeDevice, None, WholeDevice),
            ),
            (
                "claim after class",
                vec![
                    entry(false, 0, &[], Some(10), Some(30)),
                    entry(true, 1, &[], Some(4), Some(5)),
                ],
                "gpu",
                None,
                (Some(10), Config, Some(30), Config),
            ),
            (
                "field by field",
                vec![
                    entry(true, 0, &[], Some(4), None),
                    entry(false, 1, &[], None, Some(9)),
                ],
                "gpu",
                None,
                (Some(4), Config, Some(9), Config),
            ),
            (
                "other request",
                vec![entry(false, 0, &["other"], Some(4), None)],
                "gpu",
                None,
                (None, WholeDevice, None, WholeDevice),
            ),
            (
                "parent of subrequest",
                vec![entry(false, 0, &["gpu"], Some(4), None)],
                "gpu/small",
                None,
                (Some(4), Config, None, WholeDevice),
            ),
            (
                "consumed wins",
                vec![entry(false, 0, &[], Some(4), Some(1))],
                "gpu",
                Some(consumed),
                (Some(20), ConsumedCapacity, Some(25), ConsumedCapacity),
            ),
            (
                "consumed per field",
                vec![entry(false, 0, &[], Some(4), Some(1))],
                "gpu",
                Some(memory_only),
                (Some(7), ConsumedCapacity, Some(1), Config),
            ),
        ];
        for (what, mut entries, request, consumed, want) in cases {
            order(&mut entries);
            let g = resolve(&entries, request, consumed);
            assert_eq!(
                (
                    g.memory,
                    g.memory_source,
                    g.cores.map(CorePercent::get),
                    g.cores_source
                ),
                want,
                "{what}"
            );
            assert_eq!(
                g.is_whole_device(),
                want.1 == WholeDevice && want.3 == WholeDevice,
                "{what}"
            );
        }
        let g = resolve(
            &[
                entry(true, 1, &[], Some(1), None),
                entry(false, 0, &[], None, None),
            ],
            "gpu",
            None,
        );
        assert_eq!((g.priority, g.memory_entry), (Priority::High, Some(1)));
    }
}
