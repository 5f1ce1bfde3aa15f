//! CEL device selectors (`selectors[].cel.expression` of a request or sub-request),
//! evaluated by the controller over this driver's devices with the DRA CEL environment
//! (reference `dra.md` §1.5), with the `cel` crate.
//!
//! The variable `device` has
//!
//! * `driver` (string) and `allowMultipleAllocations` (bool);
//! * `attributes`: domain → name → value, from the slice (a bare name is in the driver's
//!   domain, `resource.kubernetes.io/pcieRoot` in `resource.kubernetes.io`): `int`, `bool`,
//!   `string`, and `version` as a semantic version;
//! * `capacity`: domain → name → quantity (`memory`, `cores`, ...).
//!
//! A domain the device does not publish reads as an empty map, as in Kubernetes, when the
//! expression names it by a literal (`device.attributes["example.com"]`); a missing
//! attribute is an evaluation error (guard it with `has()`), which refuses the claim as
//! kube-scheduler does. Besides the CEL standard library (`startsWith`, `contains`,
//! `matches`, `size`, macros) and its string extensions (`lowerAscii`, ...), the Kubernetes
//! libraries' functions are there: `quantity("10Gi")`, `isQuantity(s)`, on quantities
//! `compareTo`, `isGreaterThan`, `isLessThan`, `isInteger`, `asInteger`,
//! `asApproximateFloat`, `sign`, `add`, `sub` (quantity or int), and `==`; `semver("1.2.3")`,
//! `isSemver(s)`, on versions `compareTo`, `isGreaterThan`, `isLessThan`, `major`, `minor`,
//! `patch`, and `==`.
//!
//! Optional selection (`device.attributes["gpu.fgpu.dev"].?model.orValue("")`) works;
//! `cel.bind` and list attributes do not (the crate has no `cel.bind`).
//!
//! Limits: an expression longer than Kubernetes' 10 KiB is refused; the interpreter keeps
//! no cost account, so instead of Kubernetes' runtime cost limit an expression may nest
//! macros (`all`, `exists`, `map`, `filter`, ...) at most [`MAX_MACRO_NESTING`] deep.
//! Compiled programs are kept per expression ([`compile`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::extractors::This;
use cel::objects::{Key, Map, Opaque};
use cel::{Context, Env, ExecutionError, Program, Value};

/// Kubernetes' limit on the length of one selector expression (bytes).
pub const MAX_EXPRESSION_BYTES: usize = 10 * 1024;

/// How deep macros (comprehensions) may nest in one expression.
pub const MAX_MACRO_NESTING: usize = 2;

/// Compiled programs kept at most (the cache is emptied when it is full).
const CACHE_ENTRIES: usize = 1024;

/// One attribute value of a device, as the slice publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attr {
    Int(i64),
    Bool(bool),
    Str(Arc<str>),
    /// A semantic version (`version` in the slice); kept as text when it does not parse,
    /// so that comparing it is an evaluation error rather than a lost device.
    Version(Arc<str>),
}

/// What a selector sees of one device besides its driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Attribute name as published (bare, or `domain/name`) → value.
    pub attributes: Vec<(Arc<str>, Attr)>,
    /// Capacity name as published → its value.
    pub capacity: Vec<(Arc<str>, Quantity)>,
    /// `allowMultipleAllocations`.
    pub multi: bool,
}

/// A Kubernetes quantity, exactly, in nano-units (Kubernetes keeps nine decimal places).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    pub nanos: i128,
}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A semantic version (`semver("1.2.3")`, `version` attributes).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Semver(semver::Version);

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

impl Quantity {
    /// Parses Kubernetes' quantity syntax: `[+-]digits[.digits][suffix]`, suffix one of
    /// `Ki Mi Gi Ti Pi Ei`, `n u m k M G T P E`, or an exponent `e<int>` / `E<int>`.
    /// Digits beyond nano precision round up, as Kubernetes does.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("quantity {s:?}: {why}");
        let (neg, rest) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, suffix) = rest.split_at(num_len);
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(bad("no digits"));
        }
        if frac.contains('.') {
            return Err(bad("two decimal points"));
        }
        // The significand as an integer and its power of ten.
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return Err(bad("too many digits"));
        }
        let significand: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| bad("not a number"))?
        };
        let mut exp10 = -(frac.len() as i64);
        let mut binary: u32 = 0;
        match suffix {
            "" => {}
            "Ki" => binary = 10,
            "Mi" => binary = 20,
            "Gi" => binary = 30,
            "Ti" => binary = 40,
            "Pi" => binary = 50,
            "Ei" => binary = 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            e if e.starts_with(['e', 'E']) => {
                let n: i64 = e[1..]
                    .parse()
                    .map_err(|_| bad("bad exponent; valid suffixes are Ki..Ei, n..E, e<int>"))?;
                if n.abs() > 40 {
                    return Err(bad("exponent out of range"));
                }
                exp10 += n;
            }
            _ => {
                return Err(bad(
                    "unknown suffix; valid are Ki Mi Gi Ti Pi Ei n u m k M G T P E",
                ));
            }
        }
        // nanos = significand * 2^binary * 10^(exp10 + 9), rounded up.
        let overflow = || bad("too large");
        let mut v = significand
            .checked_mul(1i128 << binary)
            .ok_or_else(overflow)?;
        let e = exp10 + 9;
        if e >= 0 {
            for _ in 0..e {
                v = v.checked_mul(10).ok_or_else(overflow)?;
            }
        } else {
            let mut div: i128 = 1;
            for _ in 0..(-e).min(38) {
                div = div.saturating_mul(10);
            }
            v = if (-e) > 38 {
                i128::from(v > 0)
            } else {
                (v + div - 1) / div
            };
        }
        Ok(Self {
            nanos: if neg { -v } else { v },
        })
    }

    /// A whole number of units.
    pub fn from_int(n: i64) -> Self {
        Self {
            nanos: i128::from(n) * 1_000_000_000,
        }
    }
}

/// A selector expression, compiled.
pub struct Compiled {
    program: Program,
    /// String literals used as an index (`x["example.com"]`): domains that read as empty
    /// maps where the device publishes none.
    literal_keys: Vec<String>,
}

impl fmt::Debug for Compiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiled").finish_non_exhaustive()
    }
}

fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // The string extensions are what Kubernetes' environment has too; a conflict
        // would be a bug of the crate, and the standard library alone still works.
        let _ = env.add_extension(cel::extensions::strings);
        Arc::new(env)
    })
}

/// Compiles `expression` (or takes it from the cache): refused when longer than
/// [`MAX_EXPRESSION_BYTES`], when it does not parse, or when macros nest deeper than
/// [`MAX_MACRO_NESTING`]; the error says why.
pub fn compile(expression: &str) -> Result<Arc<Compiled>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Compiled>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().ok().and_then(|c| c.get(expression).cloned()) {
        return Ok(c);
    }
    if expression.len() > MAX_EXPRESSION_BYTES {
        return Err(format!(
            "{} bytes; an expression may have at most {MAX_EXPRESSION_BYTES}",
            expression.len()
        ));
    }
    let program = env()
        .compile(expression)
        .map_err(|e| format!("does not compile: {e}"))?;
    let mut walk = Walk::default();
    walk.expr(&program.expression().expr, 0);
    if walk.depth > MAX_MACRO_NESTING {
        return Err(format!(
            "macros (all, exists, map, filter, ...) nest {} deep; the controller allows {MAX_MACRO_NESTING}",
            walk.depth
        ));
    }
    let compiled = Arc::new(Compiled {
        program,
        literal_keys: walk.keys,
    });
    if let Ok(mut c) = cache.lock() {
        if c.len() >= CACHE_ENTRIES {
            c.clear();
        }
        c.insert(expression.to_owned(), compiled.clone());
    }
    Ok(compiled)
}

/// What [`compile`] learns from the expression tree.
#[derive(Default)]
struct Walk {
    keys: Vec<String>,
    depth: usize,
}

impl Walk {
    fn expr(&mut self, e: &Expr, depth: usize) {
        match e {
            Expr::Call(c) => {
                if (c.func_name == "_[_]" || c.func_name == "_[?_]")
                    && let Some(Expr::Literal(LiteralValue::String(s))) =
                        c.args.get(1).map(|a| &a.expr)
                {
                    self.keys.push(s.inner().to_owned());
                }
                if let Some(t) = &c.target {
                    self.expr(&t.expr, depth);
                }
                for a in &c.args {
                    self.expr(&a.expr, depth);
                }
            }
            Expr::Comprehension(c) => {
                let inner = depth + 1;
                self.depth = self.depth.max(inner);
                self.expr(&c.iter_range.expr, depth);
                for part in [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                    self.expr(&part.expr, inner);
                }
            }
            Expr::List(l) => l.elements.iter().for_each(|x| self.expr(&x.expr, depth)),
            Expr::Map(m) => {
                for en in &m.entries {
                    if let EntryExpr::MapEntry(me) = &en.expr {
                        self.expr(&me.key.expr, depth);
                        self.expr(&me.value.expr, depth);
                    }
                }
            }
            Expr::Struct(s) => {
                for en in &s.entries {
                    if let EntryExpr::StructField(f) = &en.expr {
                        self.expr(&f.value.expr, depth);
                    }
                }
            }
            Expr::Select(s) => self.expr(&s.operand.expr, depth),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

/// The functions selectors call, set up once for many evaluations.
pub struct Evaluator {
    root: Context<'static, 'static>,
}

impl Evaluator {
    /// The DRA CEL environment with Kubernetes' functions.
    pub fn new() -> Result<Self, String> {
        let mut root = Context::with_env(env().clone());
        kubernetes_functions(&mut root).map_err(|e| format!("internal: {e}"))?;
        Ok(Self { root })
    }

    /// Whether the device of `driver` described by `info` matches `selector`; an
    /// evaluation error (a missing attribute, a wrong type) or a result that is not a
    /// bool is `Err`.
    pub fn matches(
        &self,
        selector: &Compiled,
        driver: &str,
        info: &DeviceInfo,
    ) -> Result<bool, String> {
        let mut ctx = self.root.new_inner_scope();
        ctx.add_variable_from_value("device", selector.device(driver, info));
        match selector.program.execute(&ctx) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("evaluates to {other:?}, not a bool")),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Compiled {
    /// [`Evaluator::matches`] with an evaluator of its own (tests, one-off checks).
    pub fn matches(&self, driver: &str, info: &DeviceInfo) -> Result<bool, String> {
        Evaluator::new()?.matches(self, driver, info)
    }

    /// The `device` variable.
    fn device(&self, driver: &str, info: &DeviceInfo) -> Value {
        let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
        let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for k in &self.literal_keys {
            attributes.entry(k.clone()).or_default();
            capacity.entry(k.clone()).or_default();
        }
        for (name, v) in &info.attributes {
            let (domain, id) = split_name(name, driver);
            let v = match v {
                Attr::Int(i) => Value::Int(*i),
                Attr::Bool(b) => Value::Bool(*b),
                Attr::Str(s) => Value::String(Arc::new(s.to_string())),
                Attr::Version(s) => match semver::Version::parse(s) {
                    Ok(ver) => Value::Opaque(Arc::new(Semver(ver))),
                    Err(_) => Value::String(Arc::new(s.to_string())),
                },
            };
            attributes.entry(domain).or_default().insert(id, v);
        }
        for (name, q) in &info.capacity {
            let (domain, id) = split_name(name, driver);
            capacity
                .entry(domain)
                .or_default()
                .insert(id, Value::Opaque(Arc::new(*q)));
        }
        let nested = |m: HashMap<String, HashMap<String, Value>>| {
            Value::Map(Map::from(
                m.into_iter()
                    .map(|(k, v)| (k, Value::Map(Map::from(v))))
                    .collect::<HashMap<String, Value>>(),
            ))
        };
        let mut device: HashMap<Key, Value> = HashMap::new();
        device.insert(Key::from("driver"), Value::from(driver));
        device.insert(
            Key::from("allowMultipleAllocations"),
            Value::Bool(info.multi),
        );
        device.insert(Key::from("attributes"), nested(attributes));
        device.insert(Key::from("capacity"), nested(capacity));
        Value::Map(Map::from(device))
    }
}

/// `domain/name` → (domain, name); a bare name is in `driver`'s domain.
fn split_name(name: &str, driver: &str) -> (String, String) {
    match name.split_once('/') {
        Some((d, n)) => (d.to_owned(), n.to_owned()),
        None => (driver.to_owned(), name.to_owned()),
    }
}

fn quantity_of(v: &Value) -> Option<Quantity> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<Quantity>().copied(),
        _ => None,
    }
}

fn semver_of(v: &Value) -> Option<&semver::Version> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<Semver>().map(|s| &s.0),
        _ => None,
    }
}

fn wrong(function: &str, v: &Value) -> ExecutionError {
    ExecutionError::function_error(function, format!("not defined on {}", type_name(v)))
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Opaque(o) => o.runtime_type_name().to_owned(),
        other => other.type_of().to_string(),
    }
}

/// The order of two quantities or two versions.
fn order(function: &str, a: &Value, b: &Value) -> Result<std::cmp::Ordering, ExecutionError> {
    if let (Some(x), Some(y)) = (quantity_of(a), quantity_of(b)) {
        return Ok(x.cmp(&y));
    }
    if let (Some(x), Some(y)) = (semver_of(a), semver_of(b)) {
        return Ok(x.cmp(y));
    }
    Err(ExecutionError::function_error(
        function,
        format!(
            "compares a quantity with a quantity or a version with a version, not {} with {}",
            type_name(a),
            type_name(b)
        ),
    ))
}

/// A quantity or int argument of `add` / `sub`.
fn addend(function: &str, v: &Value) -> Result<Quantity, ExecutionError> {
    match v {
        Value::Int(i) => Ok(Quantity::from_int(*i)),
        v => quantity_of(v).ok_or_else(|| wrong(function, v)),
    }
}

/// Adds the functions of Kubernetes' quantity and semver CEL libraries to `ctx`.
fn kubernetes_functions(ctx: &mut Context<'_, '_>) -> Result<(), cel::DeclarationError> {
    type R = Result<Value, ExecutionError>;
    ctx.add_function("quantity", |s: Arc<String>| -> R {
        Quantity::parse(&s)
            .map(|q| Value::Opaque(Arc::new(q)))
            .map_err(|e| ExecutionError::function_error("quantity", e))
    })?;
    ctx.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok())?;
    ctx.add_function("semver", |s: Arc<String>| -> R {
        semver::Version::parse(&s)
            .map(|v| Value::Opaque(Arc::new(Semver(v))))
            .map_err(|e| ExecutionError::function_error("semver", format!("{s:?}: {e}")))
    })?;
    ctx.add_function("isSemver", |s: Arc<String>| {
        semver::Version::parse(&s).is_ok()
    })?;
    ctx.add_function("compareTo", |This(a): This<Value>, b: Value| -> R {
        Ok(Value::Int(order("compareTo", &a, &b)? as i64))
    })?;
    ctx.add_function("isGreaterThan", |This(a): This<Value>, b: Value| -> R {
        Ok(Value::Bool(order("isGreaterThan", &a, &b)?.is_gt()))
    })?;
    ctx.add_function("isLessThan", |This(a): This<Value>, b: Value| -> R {
        Ok(Value::Bool(order("isLessThan", &a, &b)?.is_lt()))
    })?;
    ctx.add_function("isInteger", |This(a): This<Value>| -> R {
        let q = quantity_of(&a).ok_or_else(|| wrong("isInteger", &a))?;
        Ok(Value::Bool(
            q.nanos % 1_000_000_000 == 0 && i64::try_from(q.nanos / 1_000_000_000).is_ok(),
        ))
    })?;
    ctx.add_function("asInteger", |This(a): This<Value>| -> R {
        let q = quantity_of(&a).ok_or_else(|| wrong("asInteger", &a))?;
        if q.nanos % 1_000_000_000 != 0 {
            return Err(ExecutionError::function_error(
                "asInteger",
                "the quantity is not a whole number",
            ));
        }
        i64::try_from(q.nanos / 1_000_000_000)
            .map(Value::Int)
            .map_err(|_| ExecutionError::function_error("asInteger", "out of the int range"))
    })?;
    ctx.add_function("asApproximateFloat", |This(a): This<Value>| -> R {
        let q = quantity_of(&a).ok_or_else(|| wrong("asApproximateFloat", &a))?;
        Ok(Value::Float(q.nanos as f64 / 1e9))
    })?;
    ctx.add_function("sign", |This(a): This<Value>| -> R {
        let q = quantity_of(&a).ok_or_else(|| wrong("sign", &a))?;
        Ok(Value::Int(q.nanos.signum() as i64))
    })?;
    ctx.add_function("add", |This(a): This<Value>, b: Value| -> R {
        let x = quantity_of(&a).ok_or_else(|| wrong("add", &a))?;
        let y = addend("add", &b)?;
        let nanos = x
            .nanos
            .checked_add(y.nanos)
            .ok_or_else(|| ExecutionError::function_error("add", "overflow"))?;
        Ok(Value::Opaque(Arc::new(Quantity { nanos })))
    })?;
    ctx.add_function("sub", |This(a): This<Value>, b: Value| -> R {
        let x = quantity_of(&a).ok_or_else(|| wrong("sub", &a))?;
        let y = addend("sub", &b)?;
        let nanos = x
            .nanos
            .checked_sub(y.nanos)
            .ok_or_else(|| ExecutionError::function_error("sub", "overflow"))?;
        Ok(Value::Opaque(Arc::new(Quantity { nanos })))
    })?;
    for (name, part) in [("major", 0usize), ("minor", 1), ("patch", 2)] {
        ctx.add_function(name, move |This(a): This<Value>| -> R {
            let v = semver_of(&a).ok_or_else(|| wrong(name, &a))?;
            let n = [v.major, v.minor, v.patch][part];
            i64::try_from(n)
                .map(Value::Int)
                .map_err(|_| ExecutionError::function_error(name, "out of the int range"))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "gpu.fgpu.dev";

    fn h100() -> DeviceInfo {
        let s = |v: &str| Attr::Str(Arc::from(v));
        DeviceInfo {
            attributes: vec![
                (Arc::from("productName"), s("NVIDIA H100 80GB HBM3")),
                (Arc::from("uuid"), s("GPU-0001")),
                (Arc::from("type"), s("gpu")),
                (Arc::from("index"), Attr::Int(0)),
                (Arc::from("numaNode"), Attr::Int(1)),
                (
                    Arc::from("driverVersion"),
                    Attr::Version(Arc::from("580.65.6")),
                ),
                (
                    Arc::from("resource.kubernetes.io/pcieRoot"),
                    s("pci0000:15"),
                ),
            ],
            capacity: vec![
                (Arc::from("memory"), Quantity::parse("80Gi").unwrap()),
                (Arc::from("cores"), Quantity::parse("100").unwrap()),
            ],
            multi: false,
        }
    }

    fn eval(expr: &str) -> Result<bool, String> {
        compile(expr)?.matches(DRIVER, &h100())
    }

    #[test]
    fn quantities_parse_exactly() {
        let q = |s: &str| Quantity::parse(s).map(|q| q.nanos);
        assert_eq!(q("1Gi"), Ok((1i128 << 30) * 1_000_000_000));
        assert_eq!(q("1024Mi"), q("1Gi"));
        assert_eq!(q("1.5k"), Ok(1_500_000_000_000));
        assert_eq!(q("100m"), Ok(100_000_000));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("-2"), Ok(-2_000_000_000));
        assert_eq!(q("0.1n"), Ok(1), "rounds up to a nano");
        assert!(q("").is_err());
        assert!(q("10 Gi").is_err());
        assert!(q("1.2.3").is_err());
        assert!(q("5Xi").is_err());
    }

    #[test]
    fn expressions_table() {
        let cases: &[(&str, Result<bool, &str>)] = &[
            (r#"device.driver == "gpu.fgpu.dev""#, Ok(true)),
            (
                r#"device.attributes["gpu.fgpu.dev"].productName == "NVIDIA H100 80GB HBM3""#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"]["productName"].startsWith("NVIDIA A100")"#,
                Ok(false),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].productName.contains("H100")"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].productName.matches("^NVIDIA H[0-9]+")"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].productName.lowerAscii().contains("h100")"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].numaNode == 1"#,
                Ok(true),
            ),
            (
                r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15""#,
                Ok(true),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory.compareTo(quantity("40Gi")) >= 0"#,
                Ok(true),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory.isGreaterThan(quantity("80Gi"))"#,
                Ok(false),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory.isLessThan(quantity("81920Mi").add(1))"#,
                Ok(true),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory == quantity("81920Mi")"#,
                Ok(true),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].cores.asInteger() == 100"#,
                Ok(true),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory.asApproximateFloat() > 8.0e10"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].driverVersion.isGreaterThan(semver("570.0.0"))"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].driverVersion.major() == 580"#,
                Ok(true),
            ),
            // A domain the device does not publish is an empty map.
            (r#"!has(device.attributes["example.com"].foo)"#, Ok(true)),
            (
                r#"has(device.attributes["gpu.fgpu.dev"].numaNode)"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].exists(k, k == "uuid")"#,
                Ok(true),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].?model.orValue("none") == "none""#,
                Ok(true),
            ),
            // Errors: a missing attribute, wrong types, no bool, a bad quantity.
            (
                r#"device.attributes["gpu.fgpu.dev"].model == "H100""#,
                Err("model"),
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory.isGreaterThan(10)"#,
                Err("compares a quantity"),
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].index"#,
                Err("not a bool"),
            ),
            (r#"quantity("ten") == quantity("10")"#, Err("quantity")),
            (
                r#"device.attributes["gpu.fgpu.dev"].uuid.asInteger() == 1"#,
                Err("asInteger"),
            ),
        ];
        for (expr, want) in cases {
            let got = eval(expr);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{expr}"),
                (Err(part), Err(e)) => assert!(e.contains(part), "{expr}: {e}"),
                _ => panic!("{expr}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn refused_at_compile_time() {
        let e = compile("device.driver ==").unwrap_err();
        assert!(e.starts_with("does not compile"), "{e}");
        let long = format!("{} true", "true &&".repeat(2000));
        let e = compile(&long).unwrap_err();
        assert!(e.contains("at most 10240"), "{e}");
        let nested = "[1,2].all(a, [1,2].all(b, [1,2].all(c, a+b+c > 0)))";
        let e = compile(nested).unwrap_err();
        assert!(e.contains("nest 3 deep"), "{e}");
        assert!(compile("[1,2].all(a, [1,2].all(b, a+b > 0))").is_ok());
    }

    #[test]
    fn compiled_programs_are_cached() {
        let a = compile("device.driver != \"x\"").unwrap();
        let b = compile("device.driver != \"x\"").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
