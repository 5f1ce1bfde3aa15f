//! The extender's Prometheus metrics (`prometheus-client`), served on `/metrics` at
//! `--metrics-address` ([`crate::http::serve_metrics`]).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `fgpu_extender_requests_total` | `verb` ([`Verb`]), `result` ([`Outcome`]) | calls of kube-scheduler's verbs by outcome |
//! | `fgpu_extender_request_duration_seconds` | `verb` | time to answer one call (a bind includes its API writes) |
//! | `fgpu_extender_pods_pending` | `reason` ([`PendingReason`]) | pods whose last filter passed no node, until a filter passes one, the pod is bound, or a resync no longer lists it unbound |
//! | `fgpu_extender_admissions_total` | `webhook` ([`Webhook`]), `result` ([`Admission`]) | admission reviews answered by the webhook |
//! | `fgpu_extender_nodes` | | nodes with a GPU inventory annotation after the last resync |
//! | `fgpu_extender_filter_cache_nodes_total` | `verb` ([`CacheVerb`]), `result` ([`CacheResult`]) | nodes whose outcome for a pod was taken from the node's kept result or worked out by the engine ([`crate::cache`]) |
//!
//! Every label value is one of a closed set (the enums here). Every series of the pending
//! gauge and of the cache counter exists from the start (0), so an alert or a ratio on
//! them has data before the first pod.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A verb kube-scheduler calls.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Verb {
    filter,
    prioritize,
    bind,
}

/// How a verb's call ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Answered without an error (filter: at least one node passed; bind: the pod is bound).
    ok,
    /// Filter only: the pod is ours and readable, but no candidate node can host it now.
    no_fit,
    /// Answered with an error: a body that does not decode, a pod of another scheduler or
    /// whose GPU request cannot be read, a bind that failed.
    error,
}

/// Why a pod waits after a filter that passed no node.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PendingReason {
    /// Some candidate has a GPU inventory, none has room for the pod now.
    no_fit,
    /// No candidate node has a usable GPU inventory (none published, or one that does not
    /// parse).
    no_gpu_node,
    /// The pod's GPU request cannot be read (HAMi resources or annotations out of range);
    /// it waits until it is replaced.
    invalid,
}

impl PendingReason {
    /// Every reason, in the order they are exported.
    pub const ALL: [PendingReason; 3] = [
        PendingReason::no_fit,
        PendingReason::no_gpu_node,
        PendingReason::invalid,
    ];
}

/// The webhook's two paths.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Webhook {
    /// `POST /mutate-pods`.
    mutate_pods,
    /// `POST /validate-pods` (the assignment guard alone).
    validate_pods,
}

/// What the webhook answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Admission {
    /// Allowed as it is.
    allowed,
    /// Allowed with a patch.
    mutated,
    /// Refused (`allowed: false`).
    denied,
    /// Not a review (answered 400).
    error,
}

/// Who asked the engine for a pod's outcome on a node (the filter cache's counter).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum CacheVerb {
    filter,
    prioritize,
    /// A sync that moved the workload model, working out the recent `fgd` and `fragaware`
    /// shapes ahead of their next pods (`Extender::sync`; evaluations only: no kept result
    /// matches the new model yet).
    sync,
}

impl CacheVerb {
    /// Every caller, in the order they are exported.
    pub const ALL: [CacheVerb; 3] = [CacheVerb::filter, CacheVerb::prioritize, CacheVerb::sync];
}

/// Where a node's outcome for a pod came from.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum CacheResult {
    /// The node's kept result for the pod's shape (never with `--no-filter-cache`).
    reused,
    /// One engine evaluation (with the cache on or off).
    evaluated,
}

impl CacheResult {
    /// Both results, in the order they are exported.
    pub const ALL: [CacheResult; 2] = [CacheResult::reused, CacheResult::evaluated];
}

/// Per-node outcomes counted since the start, summed over every [`CacheVerb`]
/// (`Extender::cache_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Outcomes taken from the nodes' kept results.
    pub reused: u64,
    /// Outcomes worked out by the engine, including those with the cache off.
    pub evaluated: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    verb: CacheVerb,
    result: CacheResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: Verb,
    result: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: Verb,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PendingLabels {
    reason: PendingReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    webhook: Webhook,
    result: Admission,
}

fn duration_histogram() -> Histogram {
    // 100 µs .. about 3.3 s (a filter over thousands of nodes; a bind with two API writes).
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// The extender's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<VerbLabels, Histogram, fn() -> Histogram>,
    pending: Family<PendingLabels, Gauge>,
    admissions: Family<AdmissionLabels, Counter>,
    nodes: Gauge,
    /// The cache counter's series, `[verb][result]` in the order of [`CacheVerb::ALL`]
    /// and [`CacheResult::ALL`]: handles on the family's own counters, so that counting
    /// takes no lock.
    cache: [[Counter; 2]; 3],
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the prefix `fgpu_extender`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fgpu_extender");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Calls of the extender's verbs (filter, prioritize, bind) by outcome",
            requests.clone(),
        );
        let durations = Family::<VerbLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer one call of a verb (a bind includes its API writes)",
            durations.clone(),
        );
        let pending = Family::<PendingLabels, Gauge>::default();
        registry.register(
            "pods_pending",
            "Pods whose last filter passed no node, by reason",
            pending.clone(),
        );
        for reason in PendingReason::ALL {
            let _ = pending.get_or_create(&PendingLabels { reason });
        }
        let admissions = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admissions",
            "Admission reviews answered by the extender's webhook, by result",
            admissions.clone(),
        );
        let nodes = Gauge::default();
        registry.register(
            "nodes",
            "Nodes with a GPU inventory annotation after the last resync",
            nodes.clone(),
        );
        let cache_nodes = Family::<CacheLabels, Counter>::default();
        registry.register(
            "filter_cache_nodes",
            "Nodes whose outcome for a pod was reused from the node's kept result or evaluated by the engine, by caller (filter, prioritize, sync); reused stays 0 with --no-filter-cache",
            cache_nodes.clone(),
        );
        let cache = CacheVerb::ALL.map(|verb| {
            CacheResult::ALL.map(|result| {
                cache_nodes
                    .get_or_create(&CacheLabels { verb, result })
                    .clone()
            })
        });
        Self {
            registry,
            requests,
            durations,
            pending,
            admissions,
            nodes,
            cache,
        }
    }

    /// Records one call of `verb`: how it ended and how long it took.
    pub fn observe(&self, verb: Verb, result: Outcome, took: std::time::Duration) {
        self.requests
            .get_or_create(&RequestLabels { verb, result })
            .inc();
        self.durations
            .get_or_create(&VerbLabels { verb })
            .observe(took.as_secs_f64());
    }

    /// Records one admission review.
    pub fn observe_admission(&self, webhook: Webhook, result: Admission) {
        self.admissions
            .get_or_create(&AdmissionLabels { webhook, result })
            .inc();
    }

    /// Sets the pending gauge: `counts[i]` pods wait for `PendingReason::ALL[i]`.
    pub fn set_pending(&self, counts: [usize; PendingReason::ALL.len()]) {
        for (reason, n) in PendingReason::ALL.into_iter().zip(counts) {
            self.pending
                .get_or_create(&PendingLabels { reason })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the number of nodes with a GPU inventory.
    pub fn set_nodes(&self, n: usize) {
        self.nodes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Counts one request's (or one sync's) per-node outcomes: `reused` taken from the
    /// nodes' kept results, `evaluated` worked out by the engine.
    pub fn count_cache(&self, verb: CacheVerb, reused: u64, evaluated: u64) {
        let series = &self.cache[verb as usize];
        series[CacheResult::reused as usize].inc_by(reused);
        series[CacheResult::evaluated as usize].inc_by(evaluated);
    }

    /// The per-node outcomes counted by [`Metrics::count_cache`] since the start.
    pub fn cache_stats(&self) -> CacheStats {
        let sum = |result: CacheResult| {
            self.cache
                .iter()
                .map(|series| series[result as usize].get())
                .sum()
        };
        CacheStats {
            reused: sum(CacheResult::reused),
            evaluated: sum(CacheResult::evaluated),
        }
    }

    /// The text exposition (OpenMetrics).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = fgpu_plumbing::exposition::OPENMETRICS;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn families_labels_and_values() {
        let m = Metrics::new();
        let text = m.encode();
        // Before any call: the pending gauge has every reason at 0, the rest no series.
        for r in ["no_fit", "no_gpu_node", "invalid"] {
            let line = format!("fgpu_extender_pods_pending{{reason=\"{r}\"}} 0\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        for t in [
            "# TYPE fgpu_extender_pods_pending gauge",
            "# TYPE fgpu_extender_nodes gauge",
        ] {
            assert!(text.contains(t), "{t} in {text}");
        }
        // A family without a series is not written at all.
        assert!(!text.contains("fgpu_extender_requests"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");

        m.observe(Verb::filter, Outcome::ok, Duration::from_millis(3));
        m.observe(Verb::filter, Outcome::no_fit, Duration::from_millis(1));
        m.observe(Verb::filter, Outcome::no_fit, Duration::from_millis(1));
        m.observe(Verb::bind, Outcome::error, Duration::from_millis(20));
        m.observe_admission(Webhook::mutate_pods, Admission::mutated);
        m.observe_admission(Webhook::validate_pods, Admission::denied);
        m.set_pending([2, 0, 1]);
        m.set_nodes(3);
        let text = m.encode();
        for t in [
            "# TYPE fgpu_extender_requests counter",
            "# TYPE fgpu_extender_request_duration_seconds histogram",
            "# TYPE fgpu_extender_admissions counter",
        ] {
            assert!(text.contains(t), "{t} in {text}");
        }
        for line in [
            r#"fgpu_extender_requests_total{verb="filter",result="ok"} 1"#,
            r#"fgpu_extender_requests_total{verb="filter",result="no_fit"} 2"#,
            r#"fgpu_extender_requests_total{verb="bind",result="error"} 1"#,
            r#"fgpu_extender_request_duration_seconds_count{verb="filter"} 3"#,
            r#"fgpu_extender_request_duration_seconds_count{verb="bind"} 1"#,
            r#"fgpu_extender_request_duration_seconds_bucket{le="+Inf",verb="bind"} 1"#,
            r#"fgpu_extender_request_duration_seconds_sum{verb="bind"} 0.02"#,
            r#"fgpu_extender_pods_pending{reason="no_fit"} 2"#,
            r#"fgpu_extender_pods_pending{reason="no_gpu_node"} 0"#,
            r#"fgpu_extender_pods_pending{reason="invalid"} 1"#,
            r#"fgpu_extender_admissions_total{webhook="mutate_pods",result="mutated"} 1"#,
            r#"fgpu_extender_admissions_total{webhook="validate_pods",result="denied"} 1"#,
            "fgpu_extender_nodes 3",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in {text}");
        }
        // No verb or result outside the closed sets appears.
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("fgpu_extender_request") && l.contains("prioritize")),
            "{text}"
        );
    }

    #[test]
    fn cache_series_start_at_zero_and_sum_into_the_stats() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(
            text.contains("# TYPE fgpu_extender_filter_cache_nodes counter\n"),
            "{text}"
        );
        for verb in ["filter", "prioritize", "sync"] {
            for result in ["reused", "evaluated"] {
                let line = format!(
                    "fgpu_extender_filter_cache_nodes_total{{verb=\"{verb}\",result=\"{result}\"}} 0\n"
                );
                assert!(text.contains(&line), "{line} in {text}");
            }
        }
        assert_eq!(m.cache_stats(), CacheStats::default());
        m.count_cache(CacheVerb::filter, 5, 1);
        m.count_cache(CacheVerb::filter, 2, 0);
        m.count_cache(CacheVerb::prioritize, 6, 0);
        m.count_cache(CacheVerb::sync, 0, 12);
        let text = m.encode();
        for line in [
            r#"fgpu_extender_filter_cache_nodes_total{verb="filter",result="reused"} 7"#,
            r#"fgpu_extender_filter_cache_nodes_total{verb="filter",result="evaluated"} 1"#,
            r#"fgpu_extender_filter_cache_nodes_total{verb="prioritize",result="reused"} 6"#,
            r#"fgpu_extender_filter_cache_nodes_total{verb="prioritize",result="evaluated"} 0"#,
            r#"fgpu_extender_filter_cache_nodes_total{verb="sync",result="reused"} 0"#,
            r#"fgpu_extender_filter_cache_nodes_total{verb="sync",result="evaluated"} 12"#,
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in {text}");
        }
        assert_eq!(
            m.cache_stats(),
            CacheStats {
                reused: 13,
                evaluated: 13
            }
        );
    }
}
