//! `GpuShareConfig`: fgpu's opaque device configuration.
//!
//! It travels in a DeviceClass's or a ResourceClaim's `config[].opaque.parameters` (and is
//! copied into `status.allocation.devices.config` by whoever allocates), for example
//!
//! ```yaml
//! opaque:
//!   driver: gpu.fgpu.dev
//!   parameters:
//!     apiVersion: gpu.fgpu.dev/v1alpha1
//!     kind: GpuShareConfig
//!     memory: 10Gi        # quantity string, or an integer number of bytes; not 0
//!     cores: 30           # percent of the GPU's SMs, 0-100; 0 = no compute reservation
//!     priority: normal    # high | normal | low
//!     oversubscribe: false
//! ```
//!
//! A DeviceClass's configuration may also say `allowHighPriority: true`: claims of that
//! class may then ask `priority: high`. Only the class may say it (the admin's decision):
//! a claim that sets it is refused, and so is a claim asking `priority: high` in a class
//! that does not allow it ([`check_priority_policy`]).
//!
//! Decoding is strict: unknown fields, wrong types, out-of-range values and quantities that
//! do not resolve to whole bytes are errors, and every error names the field path (given by
//! the caller as a prefix) and says what would be valid.
//!
//! The `apiVersion` is fixed (`gpu.fgpu.dev/v1alpha1`) even when the driver runs under
//! another name: it names the schema, not the driver. The driver is identified by
//! `opaque.driver`.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::quantity::{self, QuantityErrorKind};

/// The `apiVersion` of a [`GpuShareConfig`].
pub const API_VERSION: &str = "gpu.fgpu.dev/v1alpha1";

/// The `kind` of a [`GpuShareConfig`].
pub const KIND: &str = "GpuShareConfig";

/// Field names of a [`GpuShareConfig`], in the order they are checked and written.
pub const FIELDS: [&str; 7] = [
    "apiVersion",
    "kind",
    "memory",
    "cores",
    "priority",
    "oversubscribe",
    "allowHighPriority",
];

/// What one device allocation grants, as given in opaque configuration.
///
/// Fields left out (or `null`) are unset: `memory` and `cores` then fall back to what the
/// allocation itself says (`consumedCapacity`, or the whole device), `priority` to
/// [`Priority::Normal`] and `oversubscribe` to `false`.
///
/// ```
/// use fgpu_api::config::{CorePercent, GpuShareConfig};
/// use serde_json::json;
///
/// let params = json!({
///     "apiVersion": "gpu.fgpu.dev/v1alpha1",
///     "kind": "GpuShareConfig",
///     "memory": "10Gi",
///     "cores": 30,
/// });
/// let config = GpuShareConfig::from_value(&params, "parameters").unwrap();
/// assert_eq!(config.memory, Some(10 << 30));
/// assert_eq!(config.cores, CorePercent::new(30));
/// assert_eq!(GpuShareConfig::from_value(&config.to_value(), "").unwrap(), config);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GpuShareConfig {
    /// Device memory in bytes (written as a Kubernetes quantity, e.g. `10Gi`).
    pub memory: Option<u64>,
    /// Share of the GPU's streaming multiprocessors, in percent.
    pub cores: Option<CorePercent>,
    /// Scheduling priority of the container's kernels against others on the same GPU.
    pub priority: Priority,
    /// The share is on the oversubscribed research tier: its GPU grants more memory than it
    /// has, and the shim serves the part of the grant past the share's physical part with
    /// managed memory (spilling to host memory) instead of failing. Counts only where the
    /// DeviceClass's configuration sets it (the research class); a claim that sets it on a
    /// class that does not is refused.
    pub oversubscribe: bool,
    /// Claims of this class may ask `priority: high`. Valid only in a DeviceClass's
    /// configuration; a claim that sets it is refused.
    pub allow_high_priority: bool,
}

/// An integer percentage from 0 to 100 of a GPU's compute (streaming multiprocessors).
///
/// 0 means "no compute reservation": the container is not throttled and reserves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CorePercent(u8);

impl CorePercent {
    /// The largest value, the whole GPU.
    pub const MAX: u8 = 100;
    /// No compute reservation.
    pub const ZERO: Self = Self(0);
    /// The whole GPU.
    pub const FULL: Self = Self(Self::MAX);

    /// `Some` if `percent` is at most 100.
    pub const fn new(percent: u8) -> Option<Self> {
        if percent <= Self::MAX {
            Some(Self(percent))
        } else {
            None
        }
    }

    /// The percentage, 0 to 100.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl fmt::Display for CorePercent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Priority of a container's GPU work against other containers on the same GPU.
///
/// High-priority work may suspend the kernel launches of low-priority work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Runs first; may suspend `low` work on the same GPU.
    High,
    /// The default.
    #[default]
    Normal,
    /// Yields to `high` work.
    Low,
}

impl Priority {
    /// All priorities, highest first.
    pub const ALL: [Self; 3] = [Self::High, Self::Normal, Self::Low];

    /// The configuration spelling: `high`, `normal` or `low`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }

    /// The value for HAMi-core's `CUDA_TASK_PRIORITY`: `0` for high, `1` otherwise (HAMi
    /// knows only two classes; 1 is its default).
    pub const fn hami_task_priority(self) -> u8 {
        match self {
            Self::High => 0,
            Self::Normal | Self::Low => 1,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A priority name that is not `high`, `normal` or `low`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a valid priority; use one of high, normal, low")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPriority(s.to_owned()))
    }
}

/// A rejected configuration: the full path of the offending field and what is wrong.
///
/// Displays as `<path>: <problem>`, e.g.
/// `spec.devices.config[0].opaque.parameters.cores: 140 is above the maximum 100`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct ConfigError {
    /// Field path: the caller's prefix, a dot, the field name. With an empty prefix, just
    /// the field name, or `GpuShareConfig` for problems with the whole value.
    pub path: String,
    /// What is wrong, and what would be valid.
    pub problem: ConfigProblem,
}

/// What is wrong with a configuration field. Messages read as the predicate of a sentence
/// whose subject is the field (or the value found in it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// Text given to [`GpuShareConfig::parse`] is not JSON.
    #[error(
        "is not valid JSON ({0}); write a JSON object with apiVersion \"{API_VERSION}\" and kind \"{KIND}\""
    )]
    InvalidJson(String),
    /// The value is not a JSON object.
    #[error(
        "must be a JSON object with apiVersion \"{API_VERSION}\" and kind \"{KIND}\", found {0}"
    )]
    NotAnObject(JsonType),
    /// `apiVersion` or `kind` is missing.
    #[error("is required; set it to \"{0}\"")]
    Missing(&'static str),
    /// `apiVersion` or `kind` is not a string.
    #[error("must be the string \"{expected}\", found {found}")]
    NotAString {
        /// The only accepted value.
        expected: &'static str,
        /// What was there instead.
        found: JsonType,
    },
    /// `apiVersion` or `kind` has another value.
    #[error("{found:?} is not supported; use \"{expected}\"")]
    Unsupported {
        /// The value found.
        found: String,
        /// The only accepted value.
        expected: &'static str,
    },
    /// A field that `GpuShareConfig` does not have.
    #[error(
        "unknown field; valid fields are apiVersion, kind, memory, cores, priority, oversubscribe, allowHighPriority"
    )]
    UnknownField,
    /// `memory` is neither a string nor a number.
    #[error(
        "must be a quantity string such as \"10Gi\" or a non-negative integer number of bytes, found {0}"
    )]
    MemoryType(JsonType),
    /// `memory` does not resolve to a whole number of bytes that fits in 64 bits.
    #[error("{shown} {kind}")]
    Memory {
        /// The value as written: quoted for a string, bare for a JSON number.
        shown: String,
        /// Why it is refused.
        kind: QuantityErrorKind,
    },
    /// `memory` is zero: a share without device memory cannot run a kernel.
    #[error(
        "{0} grants no device memory; a share needs some (e.g. 512Mi), or leave memory out to take the class's or the request's"
    )]
    MemoryZero(String),
    /// `cores` is not a number.
    #[error("must be an integer percentage from 0 to 100, found {0}")]
    CoresType(JsonType),
    /// `cores` has a fractional part.
    #[error("{0} is not an integer; use a whole percentage from 0 to 100")]
    CoresNotInteger(String),
    /// `cores` is negative.
    #[error("{0} is below the minimum 0")]
    CoresBelowMin(String),
    /// `cores` is above 100.
    #[error("{0} is above the maximum 100")]
    CoresAboveMax(String),
    /// `priority` is not a string.
    #[error("must be one of the strings high, normal, low, found {0}")]
    PriorityType(JsonType),
    /// `priority` is a string other than `high`, `normal`, `low`.
    #[error("{0}")]
    Priority(UnknownPriority),
    /// `oversubscribe` or `allowHighPriority` is not a boolean.
    #[error("must be a boolean (true or false), found {0}")]
    NotABool(JsonType),
    /// `allowHighPriority` in a claim's configuration: only a DeviceClass may set it.
    #[error(
        "may be set only in a DeviceClass's configuration (the cluster admin's decision), not in a claim; remove it"
    )]
    ClassOnly,
    /// `priority: high` for a request whose DeviceClass does not allow it.
    #[error(
        "\"high\" is not allowed for request {request:?}: {class} does not set allowHighPriority: true in its GpuShareConfig; use normal or low, or a class that allows high"
    )]
    HighPriorityNotAllowed {
        /// The request the entry applies to.
        request: String,
        /// Its class as the sentence names it: `DeviceClass <name>`, or `its DeviceClass`
        /// where the name is not known (prepare sees only the allocation).
        class: String,
    },
    /// `oversubscribe: true` in a claim's configuration for a request whose DeviceClass
    /// does not set it.
    #[error(
        "true is not allowed for request {request:?}: {class} does not set oversubscribe: true in its GpuShareConfig; only the research-tier class (research.<driver>) oversubscribes, so ask that class instead"
    )]
    OversubscribeNotAllowed {
        /// The request the entry applies to.
        request: String,
        /// Its class as the sentence names it (see [`Self::HighPriorityNotAllowed`]).
        class: String,
    },
}

/// The type of a JSON value, for error messages ("found a string").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JsonType {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// The type of `value`.
    pub const fn of(value: &Value) -> Self {
        match value {
            Value::Null => Self::Null,
            Value::Bool(_) => Self::Bool,
            Value::Number(_) => Self::Number,
            Value::String(_) => Self::String,
            Value::Array(_) => Self::Array,
            Value::Object(_) => Self::Object,
        }
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Null => "null",
            Self::Bool => "a boolean",
            Self::Number => "a number",
            Self::String => "a string",
            Self::Array => "an array",
            Self::Object => "an object",
        })
    }
}

impl GpuShareConfig {
    /// Decodes JSON text, e.g. a config file. See [`from_value`](Self::from_value).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if the text is not JSON or not a valid `GpuShareConfig`.
    pub fn parse(json: &str, path: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(json).map_err(|e| ConfigError {
            path: root_path(path),
            problem: ConfigProblem::InvalidJson(e.to_string()),
        })?;
        Self::from_value(&value, path)
    }

    /// Decodes `opaque.parameters`. `path` is where the value sits in its object, e.g.
    /// `spec.devices.config[0].opaque.parameters`; errors name fields below it.
    ///
    /// The first problem found is reported, checking `apiVersion`, `kind`, unknown fields
    /// (alphabetically first), then the fields in the order of [`FIELDS`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for anything but a valid `GpuShareConfig`.
    pub fn from_value(value: &Value, path: &str) -> Result<Self, ConfigError> {
        let object = value.as_object().ok_or_else(|| ConfigError {
            path: root_path(path),
            problem: ConfigProblem::NotAnObject(JsonType::of(value)),
        })?;
        let at = |field: &str, problem| ConfigError {
            path: field_path(path, field),
            problem,
        };

        for (field, expected) in [("apiVersion", API_VERSION), ("kind", KIND)] {
            match object.get(field) {
                None => return Err(at(field, ConfigProblem::Missing(expected))),
                Some(Value::String(found)) if found == expected => {}
                Some(Value::String(found)) => {
                    let found = found.clone();
                    return Err(at(field, ConfigProblem::Unsupported { found, expected }));
                }
                Some(other) => {
                    let found = JsonType::of(other);
                    return Err(at(field, ConfigProblem::NotAString { expected, found }));
                }
            }
        }
        if let Some(unknown) = object
            .keys()
            .filter(|k| !FIELDS.contains(&k.as_str()))
            .min()
        {
            return Err(at(unknown, ConfigProblem::UnknownField));
        }

        let field = |name: &str| object.get(name).filter(|v| !v.is_null());
        let mut config = Self::default();
        if let Some(memory) = field("memory") {
            config.memory = Some(decode_memory(memory).map_err(|p| at("memory", p))?);
        }
        if let Some(cores) = field("cores") {
            config.cores = Some(decode_cores(cores).map_err(|p| at("cores", p))?);
        }
        if let Some(priority) = field("priority") {
            config.priority = match priority {
                Value::String(s) => s
                    .parse()
                    .map_err(|e| at("priority", ConfigProblem::Priority(e)))?,
                other => {
                    let problem = ConfigProblem::PriorityType(JsonType::of(other));
                    return Err(at("priority", problem));
                }
            };
        }
        if let Some(oversubscribe) = field("oversubscribe") {
            config.oversubscribe = oversubscribe.as_bool().ok_or_else(|| {
                at(
                    "oversubscribe",
                    ConfigProblem::NotABool(JsonType::of(oversubscribe)),
                )
            })?;
        }
        if let Some(allow) = field("allowHighPriority") {
            config.allow_high_priority = allow.as_bool().ok_or_else(|| {
                at(
                    "allowHighPriority",
                    ConfigProblem::NotABool(JsonType::of(allow)),
                )
            })?;
        }
        Ok(config)
    }

    /// Encodes in canonical form: `apiVersion`, `kind`, then only the fields that differ
    /// from their defaults, `memory` as a canonical quantity string (`10Gi`).
    /// [`from_value`](Self::from_value) of the result gives `self` back.
    pub fn to_value(&self) -> Value {
        let mut object = Map::new();
        object.insert("apiVersion".into(), API_VERSION.into());
        object.insert("kind".into(), KIND.into());
        if let Some(memory) = self.memory {
            object.insert("memory".into(), quantity::format_u64(memory).into());
        }
        if let Some(cores) = self.cores {
            object.insert("cores".into(), cores.get().into());
        }
        if self.priority != Priority::default() {
            object.insert("priority".into(), self.priority.as_str().into());
        }
        if self.oversubscribe {
            object.insert("oversubscribe".into(), true.into());
        }
        if self.allow_high_priority {
            object.insert("allowHighPriority".into(), true.into());
        }
        Value::Object(object)
    }
}

/// Path of the whole value.
fn root_path(prefix: &str) -> String {
    if prefix.is_empty() {
        KIND.to_owned()
    } else {
        prefix.to_owned()
    }
}

/// Path of a field below `prefix`.
fn field_path(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

/// A quantity string or a JSON number, in bytes.
fn decode_memory(value: &Value) -> Result<u64, ConfigProblem> {
    // Numbers go through the quantity parser too (in their JSON spelling: `1.5`, `1e+20`),
    // so `1e9` is accepted and `1.5` is refused with the same rules as strings.
    let (text, shown) = match value {
        Value::String(s) => (s.clone(), format!("{s:?}")),
        Value::Number(n) => (n.to_string(), n.to_string()),
        other => return Err(ConfigProblem::MemoryType(JsonType::of(other))),
    };
    match quantity::parse_u64(&text) {
        Ok(0) => Err(ConfigProblem::MemoryZero(shown)),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(ConfigProblem::Memory {
            shown,
            kind: e.kind,
        }),
    }
}

/// An integer from 0 to 100.
fn decode_cores(value: &Value) -> Result<CorePercent, ConfigProblem> {
    let Value::Number(n) = value else {
        return Err(ConfigProblem::CoresType(JsonType::of(value)));
    };
    let shown = n.to_string();
    let whole = if let Some(u) = n.as_u64() {
        Some(u)
    } else if n.as_i64().is_some() {
        return Err(ConfigProblem::CoresBelowMin(shown));
    } else {
        // A float: accept whole values written as such (`30.0`).
        let f = n.as_f64().unwrap_or(f64::NAN);
        if f.fract() != 0.0 || !f.is_finite() {
            return Err(ConfigProblem::CoresNotInteger(shown));
        }
        if f < 0.0 {
            return Err(ConfigProblem::CoresBelowMin(shown));
        }
        // Whole and non-negative; anything too big for the cast is above the maximum anyway.
        (f <= f64::from(CorePercent::MAX)).then_some(f as u64)
    };
    whole
        .and_then(|u| u8::try_from(u).ok())
        .and_then(CorePercent::new)
        .ok_or(ConfigProblem::CoresAboveMax(shown))
}

impl Serialize for GpuShareConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for GpuShareConfig {
    /// Strict decoding as [`GpuShareConfig::from_value`] with an empty path prefix.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_value(&value, "").map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const PREFIX: &str = "spec.devices.config[0].opaque.parameters";

    /// A valid header plus `fields`.
    fn with(fields: Value) -> Value {
        let mut value = json!({"apiVersion": API_VERSION, "kind": KIND});
        let object = value.as_object_mut().unwrap();
        for (k, v) in fields.as_object().unwrap() {
            object.insert(k.clone(), v.clone());
        }
        value
    }

    fn err(value: &Value) -> String {
        match GpuShareConfig::from_value(value, PREFIX) {
            Ok(config) => panic!("{value} was accepted as {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn rejects_bad_input_with_exact_messages() {
        let p = PREFIX;
        let quantity_hint =
            "use one of Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, m or an exponent such as e9";
        let whole_hint = "use a value that resolves to one, such as 1536 or 1.5Ki";
        let too_large = "is too large; the maximum is 18446744073709551615 (just under 16Ei)";
        let number_hint = "is not a valid quantity; it must start with a number (digits with at most one decimal point), such as 1.5Gi or 512Mi";
        let fields = "valid fields are apiVersion, kind, memory, cores, priority, oversubscribe, allowHighPriority";
        let object_hint = r#"must be a JSON object with apiVersion "gpu.fgpu.dev/v1alpha1" and kind "GpuShareConfig""#;
        let memory_type =
            r#"must be a quantity string such as "10Gi" or a non-negative integer number of bytes"#;
        let cases: Vec<(Value, String)> = vec![
            // The value as a whole.
            (json!("10Gi"), format!("{p}: {object_hint}, found a string")),
            (json!(null), format!("{p}: {object_hint}, found null")),
            (json!([1]), format!("{p}: {object_hint}, found an array")),
            (json!(42), format!("{p}: {object_hint}, found a number")),
            // apiVersion and kind.
            (
                json!({"kind": KIND}),
                format!(r#"{p}.apiVersion: is required; set it to "gpu.fgpu.dev/v1alpha1""#),
            ),
            (
                json!({"apiVersion": 1, "kind": KIND}),
                format!(
                    r#"{p}.apiVersion: must be the string "gpu.fgpu.dev/v1alpha1", found a number"#
                ),
            ),
            (
                json!({"apiVersion": "gpu.fgpu.dev/v1", "kind": KIND}),
                format!(
                    r#"{p}.apiVersion: "gpu.fgpu.dev/v1" is not supported; use "gpu.fgpu.dev/v1alpha1""#
                ),
            ),
            (
                json!({"apiVersion": API_VERSION}),
                format!(r#"{p}.kind: is required; set it to "GpuShareConfig""#),
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig"}),
                format!(r#"{p}.kind: "GpuConfig" is not supported; use "GpuShareConfig""#),
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": null}),
                format!(r#"{p}.kind: must be the string "GpuShareConfig", found null"#),
            ),
            // Unknown fields (the alphabetically first is reported).
            (
                with(json!({"mem": "1Gi"})),
                format!("{p}.mem: unknown field; {fields}"),
            ),
            (
                with(json!({"zeta": 1, "Memory": "1Gi"})),
                format!("{p}.Memory: unknown field; {fields}"),
            ),
            // memory: types.
            (
                with(json!({"memory": true})),
                format!("{p}.memory: {memory_type}, found a boolean"),
            ),
            (
                with(json!({"memory": ["1Gi"]})),
                format!("{p}.memory: {memory_type}, found an array"),
            ),
            (
                with(json!({"memory": {"value": "1Gi"}})),
                format!("{p}.memory: {memory_type}, found an object"),
            ),
            // memory: malformed strings.
            (
                with(json!({"memory": ""})),
                format!(
                    r#"{p}.memory: "" is not a quantity; use a number with an optional suffix, such as 512Mi, 10Gi, 1G or 1e9"#
                ),
            ),
            (
                with(json!({"memory": "10GB"})),
                format!(r#"{p}.memory: "10GB" has an unknown suffix; {quantity_hint}"#),
            ),
            (
                with(json!({"memory": "10gi"})),
                format!(r#"{p}.memory: "10gi" has an unknown suffix; {quantity_hint}"#),
            ),
            (
                with(json!({"memory": "1 Gi"})),
                format!(r#"{p}.memory: "1 Gi" has an unknown suffix; {quantity_hint}"#),
            ),
            (
                with(json!({"memory": "1e"})),
                format!(r#"{p}.memory: "1e" has an unknown suffix; {quantity_hint}"#),
            ),
            (
                with(json!({"memory": "Gi"})),
                format!(r#"{p}.memory: "Gi" {number_hint}"#),
            ),
            (
                with(json!({"memory": "1.2.3Gi"})),
                format!(r#"{p}.memory: "1.2.3Gi" {number_hint}"#),
            ),
            (
                with(json!({"memory": " 1Gi"})),
                format!(r#"{p}.memory: " 1Gi" {number_hint}"#),
            ),
            // memory: negative.
            (
                with(json!({"memory": "-1Gi"})),
                format!(r#"{p}.memory: "-1Gi" is negative; use 0 or more"#),
            ),
            (
                with(json!({"memory": -5})),
                format!("{p}.memory: -5 is negative; use 0 or more"),
            ),
            // memory: fractional bytes.
            (
                with(json!({"memory": 1.5})),
                format!("{p}.memory: 1.5 is not a whole number; {whole_hint}"),
            ),
            (
                with(json!({"memory": "1.5"})),
                format!(r#"{p}.memory: "1.5" is not a whole number; {whole_hint}"#),
            ),
            (
                with(json!({"memory": "0.1Ki"})),
                format!(r#"{p}.memory: "0.1Ki" is not a whole number; {whole_hint}"#),
            ),
            (
                with(json!({"memory": "1500m"})),
                format!(r#"{p}.memory: "1500m" is not a whole number; {whole_hint}"#),
            ),
            (
                with(json!({"memory": "1e-3"})),
                format!(r#"{p}.memory: "1e-3" is not a whole number; {whole_hint}"#),
            ),
            // memory: zero (in any spelling).
            (
                with(json!({"memory": 0})),
                format!(
                    "{p}.memory: 0 grants no device memory; a share needs some (e.g. 512Mi), or leave memory out to take the class's or the request's"
                ),
            ),
            (
                with(json!({"memory": "0Gi"})),
                format!(
                    r#"{p}.memory: "0Gi" grants no device memory; a share needs some (e.g. 512Mi), or leave memory out to take the class's or the request's"#
                ),
            ),
            (
                with(json!({"memory": "400m"})),
                format!(r#"{p}.memory: "400m" is not a whole number; {whole_hint}"#),
            ),
            // memory: beyond u64.
            (
                with(json!({"memory": "16Ei"})),
                format!(r#"{p}.memory: "16Ei" {too_large}"#),
            ),
            (
                with(json!({"memory": "18446744073709551616"})),
                format!(r#"{p}.memory: "18446744073709551616" {too_large}"#),
            ),
            (
                with(json!({"memory": 1e20})),
                format!("{p}.memory: 1e+20 {too_large}"),
            ),
            // cores.
            (
                with(json!({"cores": 140})),
                format!("{p}.cores: 140 is above the maximum 100"),
            ),
            (
                with(json!({"cores": 101})),
                format!("{p}.cores: 101 is above the maximum 100"),
            ),
            (
                with(json!({"cores": 1e300})),
                format!("{p}.cores: 1e+300 is above the maximum 100"),
            ),
            (
                with(json!({"cores": -5})),
                format!("{p}.cores: -5 is below the minimum 0"),
            ),
            (
                with(json!({"cores": 12.5})),
                format!("{p}.cores: 12.5 is not an integer; use a whole percentage from 0 to 100"),
            ),
            (
                with(json!({"cores": "30"})),
                format!("{p}.cores: must be an integer percentage from 0 to 100, found a string"),
            ),
            (
                with(json!({"cores": false})),
                format!("{p}.cores: must be an integer percentage from 0 to 100, found a boolean"),
            ),
            // priority.
            (
                with(json!({"priority": "urgent"})),
                format!(
                    r#"{p}.priority: "urgent" is not a valid priority; use one of high, normal, low"#
                ),
            ),
            (
                with(json!({"priority": "High"})),
                format!(
                    r#"{p}.priority: "High" is not a valid priority; use one of high, normal, low"#
                ),
            ),
            (
                with(json!({"priority": 0})),
                format!(
                    "{p}.priority: must be one of the strings high, normal, low, found a number"
                ),
            ),
            // oversubscribe.
            (
                with(json!({"oversubscribe": "true"})),
                format!("{p}.oversubscribe: must be a boolean (true or false), found a string"),
            ),
            (
                with(json!({"oversubscribe": 1})),
                format!("{p}.oversubscribe: must be a boolean (true or false), found a number"),
            ),
            (
                with(json!({"allowHighPriority": "yes"})),
                format!("{p}.allowHighPriority: must be a boolean (true or false), found a string"),
            ),
        ];
        assert!(cases.len() >= 30);
        for (value, expected) in &cases {
            assert_eq!(&err(value), expected, "input {value}");
        }
    }

    #[test]
    fn the_brief_example_message() {
        let e = GpuShareConfig::from_value(&with(json!({"cores": 140})), PREFIX).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.devices.config[0].opaque.parameters.cores: 140 is above the maximum 100"
        );
        assert_eq!(e.path, format!("{PREFIX}.cores"));
    }

    #[test]
    fn empty_prefix_names_the_field_or_the_kind() {
        let e = GpuShareConfig::from_value(&with(json!({"cores": 140})), "").unwrap_err();
        assert_eq!(e.to_string(), "cores: 140 is above the maximum 100");
        let e = GpuShareConfig::from_value(&json!("x"), "").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"GpuShareConfig: must be a JSON object with apiVersion "gpu.fgpu.dev/v1alpha1" and kind "GpuShareConfig", found a string"#
        );
    }

    #[test]
    fn invalid_json_text() {
        let e = GpuShareConfig::parse("{", "config.json").unwrap_err();
        assert_eq!(e.path, "config.json");
        assert!(matches!(e.problem, ConfigProblem::InvalidJson(_)));
        assert!(
            e.to_string()
                .starts_with("config.json: is not valid JSON (")
        );
    }

    #[test]
    fn accepts_good_input() {
        let cases: Vec<(Value, GpuShareConfig)> = vec![
            (with(json!({})), GpuShareConfig::default()),
            (
                with(
                    json!({"memory": null, "cores": null, "priority": null, "oversubscribe": null}),
                ),
                GpuShareConfig::default(),
            ),
            (
                with(json!({"memory": "10Gi", "cores": 30})),
                GpuShareConfig {
                    memory: Some(10 << 30),
                    cores: CorePercent::new(30),
                    ..Default::default()
                },
            ),
            (
                with(
                    json!({"memory": "1.5Gi", "cores": 0, "priority": "high", "oversubscribe": true}),
                ),
                GpuShareConfig {
                    memory: Some(3 << 29),
                    cores: Some(CorePercent::ZERO),
                    priority: Priority::High,
                    oversubscribe: true,
                    allow_high_priority: false,
                },
            ),
            (
                with(json!({"memory": "1G", "cores": 100, "priority": "low"})),
                GpuShareConfig {
                    memory: Some(1_000_000_000),
                    cores: Some(CorePercent::FULL),
                    priority: Priority::Low,
                    oversubscribe: false,
                    allow_high_priority: false,
                },
            ),
            (with(json!({"memory": 1073741824})), memory(1 << 30)),
            (with(json!({"memory": "1073741824"})), memory(1 << 30)),
            (with(json!({"memory": 1e9})), memory(1_000_000_000)),
            (with(json!({"memory": "1e9"})), memory(1_000_000_000)),
            (with(json!({"memory": "512Mi"})), memory(512 << 20)),
            (with(json!({"memory": "2000m"})), memory(2)),
            (with(json!({"memory": u64::MAX})), memory(u64::MAX)),
            (
                with(json!({"cores": 30.0})),
                GpuShareConfig {
                    cores: CorePercent::new(30),
                    ..Default::default()
                },
            ),
        ];
        for (value, expected) in cases {
            let parsed = GpuShareConfig::from_value(&value, PREFIX);
            assert_eq!(parsed.as_ref(), Ok(&expected), "{value}");
            // Canonical encoding round-trips.
            let again = GpuShareConfig::from_value(&expected.to_value(), PREFIX);
            assert_eq!(again, Ok(expected));
        }
    }

    fn memory(bytes: u64) -> GpuShareConfig {
        GpuShareConfig {
            memory: Some(bytes),
            ..Default::default()
        }
    }

    #[test]
    fn canonical_encoding() {
        let config = GpuShareConfig {
            memory: Some(1536 << 20),
            cores: CorePercent::new(25),
            priority: Priority::High,
            oversubscribe: true,
            allow_high_priority: false,
        };
        assert_eq!(
            config.to_value(),
            json!({
                "apiVersion": "gpu.fgpu.dev/v1alpha1",
                "kind": "GpuShareConfig",
                "memory": "1536Mi",
                "cores": 25,
                "priority": "high",
                "oversubscribe": true,
            })
        );
        assert_eq!(
            GpuShareConfig::default().to_value(),
            json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig"})
        );
    }

    #[test]
    fn allow_high_priority_decodes_and_round_trips() {
        let c =
            GpuShareConfig::from_value(&with(json!({"allowHighPriority": true})), PREFIX).unwrap();
        assert!(c.allow_high_priority);
        assert_eq!(
            c.to_value(),
            json!({"apiVersion": API_VERSION, "kind": KIND, "allowHighPriority": true})
        );
        let off = GpuShareConfig::from_value(&with(json!({"allowHighPriority": false})), PREFIX);
        assert_eq!(off, Ok(GpuShareConfig::default()));
        let e = ConfigError {
            path: "spec.devices.config[0].opaque.parameters.priority".into(),
            problem: ConfigProblem::HighPriorityNotAllowed {
                request: "gpu".into(),
                class: "DeviceClass shared.gpu.fgpu.dev".into(),
            },
        };
        assert_eq!(
            e.to_string(),
            r#"spec.devices.config[0].opaque.parameters.priority: "high" is not allowed for request "gpu": DeviceClass shared.gpu.fgpu.dev does not set allowHighPriority: true in its GpuShareConfig; use normal or low, or a class that allows high"#
        );
    }

    #[test]
    fn serde_impls_are_strict() {
        let text =
            r#"{"apiVersion":"gpu.fgpu.dev/v1alpha1","kind":"GpuShareConfig","memory":"1Gi"}"#;
        let config: GpuShareConfig = serde_json::from_str(text).unwrap();
        assert_eq!(config, memory(1 << 30));
        assert_eq!(serde_json::to_string(&config).unwrap(), text);
        let bad = r#"{"apiVersion":"gpu.fgpu.dev/v1alpha1","kind":"GpuShareConfig","cores":140}"#;
        let e = serde_json::from_str::<GpuShareConfig>(bad).unwrap_err();
        assert_eq!(e.to_string(), "cores: 140 is above the maximum 100");
    }

    #[test]
    fn priorities() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse(), Ok(p));
        }
        assert_eq!(Priority::default(), Priority::Normal);
        assert_eq!(Priority::High.hami_task_priority(), 0);
        assert_eq!(Priority::Low.hami_task_priority(), 1);
        assert_eq!(CorePercent::new(101), None);
    }

    fn any_config() -> impl Strategy<Value = GpuShareConfig> {
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of(0u8..=100),
            proptest::sample::select(Priority::ALL.to_vec()),
            any::<bool>(),
        )
            .prop_map(|(memory, cores, priority, oversubscribe)| GpuShareConfig {
                memory,
                cores: cores.and_then(CorePercent::new),
                priority,
                oversubscribe,
                allow_high_priority: oversubscribe && priority == Priority::Low,
            })
    }

    proptest! {
        #[test]
        fn to_value_round_trips(config in any_config()) {
            let value = config.to_value();
            prop_assert_eq!(GpuShareConfig::from_value(&value, PREFIX), Ok(config.clone()));
            let text = serde_json::to_string(&config).unwrap();
            prop_assert_eq!(GpuShareConfig::parse(&text, PREFIX), Ok(config));
        }

        #[test]
        fn memory_as_json_integer(bytes: u64) {
            let value = with(json!({"memory": bytes}));
            prop_assert_eq!(GpuShareConfig::from_value(&value, PREFIX), Ok(memory(bytes)));
        }
    }
}
