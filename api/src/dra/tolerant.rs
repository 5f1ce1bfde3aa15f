//! Tolerant field readers for the DRA model (claims, classes, slices): serde
//! `deserialize_with` functions that never fail on a value of the wrong JSON type. Each
//! says what it makes of an odd value:
//!
//! * absent: `None`, `""`, `false`, an empty list or map, or the type's default, the way
//!   indexing a `serde_json::Value` did (`v["x"]` of a number is `Null`, `as_str()` of a
//!   number is `None`): [`string`], [`opt_string`], [`flag`], [`opt_flag`], [`opt_int`],
//!   [`object`], [`opt_object`], [`list`], [`strings`], [`map`], [`quantities`]. The
//!   elements of a list of objects keep their index: one that is not an object reads as
//!   the default.
//! * present but empty: [`opt_list`] (`Some` of an empty list), for fields where being
//!   there at all means something.
//! * kept as it came: [`checked_list`] ([`Checked::Invalid`] holding the [`RawJson`]), for
//!   fields whose reader reports what the value was.
//!
//! They are used with `#[serde(default, deserialize_with = "...")]`, so that a missing field
//! reads as the default too. With every field of the model read through these (or as a
//! `serde_json::Value`, or a type that takes any value such as [`Checked`]), any JSON object
//! reads as a claim, a class or a slice: what is wrong with a field is found by the code
//! that uses it, which names the field, and not by the parser, which cannot. The API server
//! validates objects against their schema, so in a cluster the fallbacks never fire; they
//! keep hand-written and test objects, and the controller's messages about them, as they
//! were.
//!
//! All readers share one visitor: a leaf (a private `Leaf` type) says what it makes of
//! each JSON shape, and a reader picks the leaf and the fallback.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

/// A JSON value of a type the model does not read at that place, kept as its compact
/// text: the reader can say what it was, and the model serializes it back unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawJson(String);

impl RawJson {
    /// The compact JSON text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// The value, parsed again.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }
}

impl From<serde_json::Value> for RawJson {
    fn from(v: serde_json::Value) -> Self {
        Self(v.to_string())
    }
}

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Value::deserialize(d).map(Self::from)
    }
}

/// A field read as `T`, or [`RawJson`] when its JSON type is another.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Checked<T> {
    /// The field as the model reads it.
    Valid(T),
    /// A value of another JSON type.
    Invalid(RawJson),
}

/// Reads past the rest of an object.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Reads past the rest of an array.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// What a leaf makes of each JSON shape: `None` for a shape it does not take (the field
/// then reads as its default). `null` is `None` for every leaf.
trait Leaf<'de>: Sized {
    /// A string.
    fn from_str(_: &str) -> Option<Self> {
        None
    }
    /// `true` or `false`.
    fn from_bool(_: bool) -> Option<Self> {
        None
    }
    /// A number, as JSON spells it.
    fn from_number(_: serde_json::Number) -> Option<Self> {
        None
    }
    /// An object.
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        skip_map(map).map(|()| None)
    }
    /// An array.
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        skip_seq(seq).map(|()| None)
    }
}

/// Reads any JSON value as the leaf `T` (`None`: a shape `T` does not take, or `null`).
struct LeafVisitor<T>(PhantomData<T>);

impl<'de, T: Leaf<'de>> Visitor<'de> for LeafVisitor<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(T::from_bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(T::from_number(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(T::from_number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).and_then(T::from_number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(T::from_str(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::from_map(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::from_seq(seq)
    }
}

/// Reads one value as the leaf `T`.
fn leaf<'de, T: Leaf<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
    d.deserialize_any(LeafVisitor(PhantomData))
}

/// A leaf as a type serde can read (an element of a list, a value of a map): `None` for
/// `null` or a shape `L` does not take.
struct Maybe<L>(Option<L>);

impl<'de, L: Leaf<'de>> Deserialize<'de> for Maybe<L> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d).map(Self)
    }
}

/// A string leaf.
struct Text(String);

impl Leaf<'_> for Text {
    fn from_str(s: &str) -> Option<Self> {
        Some(Self(s.to_owned()))
    }
}

/// A boolean leaf.
struct Flag(bool);

impl Leaf<'_> for Flag {
    fn from_bool(b: bool) -> Option<Self> {
        Some(Self(b))
    }
}

/// An integer leaf: a JSON number that is an integer and fits an `i64` (`1.5` and `1.0`
/// are not).
struct Int(i64);

impl Leaf<'_> for Int {
    fn from_number(n: serde_json::Number) -> Option<Self> {
        n.as_i64().map(Self)
    }
}

/// An object leaf: the struct (or map) `T`.
#[derive(Default)]
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Leaf<'de> for Object<T> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(|t| Some(Self(t)))
    }
}

/// An array leaf whose elements are read by `E`.
struct List<E>(Vec<E>);

impl<E> Default for List<E> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<'de, E: Deserialize<'de>> Leaf<'de> for List<E> {
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        Vec::<E>::deserialize(SeqAccessDeserializer::new(seq)).map(|v| Some(Self(v)))
    }
}

/// The leaf `L` where it takes the value, `L::default()` for any other value but `null`:
/// a value that is there at all counts, whatever its shape.
struct OrDefault<L>(L);

impl<'de, L: Leaf<'de> + Default> Leaf<'de> for OrDefault<L> {
    fn from_str(s: &str) -> Option<Self> {
        Some(Self(L::from_str(s).unwrap_or_default()))
    }
    fn from_bool(b: bool) -> Option<Self> {
        Some(Self(L::from_bool(b).unwrap_or_default()))
    }
    fn from_number(n: serde_json::Number) -> Option<Self> {
        Some(Self(L::from_number(n).unwrap_or_default()))
    }
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        Ok(Some(Self(L::from_map(map)?.unwrap_or_default())))
    }
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        Ok(Some(Self(L::from_seq(seq)?.unwrap_or_default())))
    }
}

/// A member of a list or map of objects: `T` for an object, `T::default()` for any other
/// value but `null`.
type Member<T> = OrDefault<Object<T>>;

/// One element of a list of objects: a [`Member`], and `T::default()` for `null` too, so
/// that every element keeps its index.
#[derive(Default)]
struct Element<T>(T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(
            leaf::<Member<T>, D>(d)?.map(|m| m.0.0).unwrap_or_default(),
        ))
    }
}

/// The elements of a list of objects.
fn elements<T>(list: List<Element<T>>) -> Vec<T> {
    list.0.into_iter().map(|e| e.0).collect()
}

/// A list of objects that is there at all: its elements, or empty when the value is not
/// a list.
type Present<T> = OrDefault<List<Element<T>>>;

/// A list of objects, or the value kept as [`RawJson`] when it is not a list.
struct CheckedList<T>(Checked<Vec<T>>);

impl<T> CheckedList<T> {
    /// A value that is not a list.
    fn invalid(v: serde_json::Value) -> Option<Self> {
        Some(Self(Checked::Invalid(v.into())))
    }
}

impl<'de, T: Deserialize<'de> + Default> Leaf<'de> for CheckedList<T> {
    fn from_str(s: &str) -> Option<Self> {
        Self::invalid(s.into())
    }
    fn from_bool(b: bool) -> Option<Self> {
        Self::invalid(b.into())
    }
    fn from_number(n: serde_json::Number) -> Option<Self> {
        Self::invalid(n.into())
    }
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        serde_json::Value::deserialize(MapAccessDeserializer::new(map)).map(Self::invalid)
    }
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        Ok(List::from_seq(seq)?.map(|l| Self(Checked::Valid(elements(l)))))
    }
}

/// An object of objects by name: a `null` value is left out, one that is not an object
/// reads as `T::default()` (a [`Member`]).
struct Members<T>(BTreeMap<String, T>);

impl<'de, T: Deserialize<'de> + Default> Leaf<'de> for Members<T> {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        let mut out = BTreeMap::new();
        while let Some((k, Maybe(v))) = map.next_entry::<String, Maybe<Member<T>>>()? {
            if let Some(OrDefault(Object(v))) = v {
                out.insert(k, v);
            }
        }
        Ok(Some(Self(out)))
    }
}

/// A quantity as text: a string as it is, a number as JSON spells it, anything else as its
/// JSON text (which no quantity parser takes, so the field is still refused).
struct QuantityText(String);

impl<'de> Leaf<'de> for QuantityText {
    fn from_str(s: &str) -> Option<Self> {
        Some(Self(s.to_owned()))
    }
    fn from_bool(b: bool) -> Option<Self> {
        Some(Self(b.to_string()))
    }
    fn from_number(n: serde_json::Number) -> Option<Self> {
        Some(Self(n.to_string()))
    }
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        skip_map(map).map(|()| Some(Self("{...}".to_owned())))
    }
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        skip_seq(seq).map(|()| Some(Self("[...]".to_owned())))
    }
}

impl<'de> Deserialize<'de> for QuantityText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(leaf::<Self, D>(d)?.unwrap_or_else(|| Self("null".to_owned())))
    }
}

/// A string; `""` when absent or not a string.
pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(opt_string(d)?.unwrap_or_default())
}

/// A string; `None` when absent or not a string.
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(leaf::<Text, D>(d)?.map(|t| t.0))
}

/// `true` only for JSON `true`.
pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(opt_flag(d)? == Some(true))
}

/// A boolean; `None` when absent or not a boolean.
pub fn opt_flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(leaf::<Flag, D>(d)?.map(|f| f.0))
}

/// An integer; `None` when absent, not a number, not an integer or beyond `i64`.
pub fn opt_int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(leaf::<Int, D>(d)?.map(|i| i.0))
}

/// An object read as `T`; `T::default()` when absent or not an object.
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(opt_object(d)?.unwrap_or_default())
}

/// An object read as `T`; `None` when absent or not an object.
pub fn opt_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(leaf::<Object<T>, D>(d)?.map(|o| o.0))
}

/// A list of objects read as `T` (an element that is not an object reads as
/// `T::default()`); empty when absent or not a list.
pub fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(opt_list(d)?.unwrap_or_default())
}

/// Like [`list`], but `None` when absent or `null` and `Some(empty)` when not a list: for
/// fields where being there at all means something.
pub fn opt_list<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(leaf::<Present<T>, D>(d)?.map(|p| elements(p.0)))
}

/// Like [`list`], but `None` when absent or `null` and [`Checked::Invalid`] (the value as
/// it came) when not a list: for fields whose reader reports a value of the wrong type.
pub fn checked_list<'de, D, T>(d: D) -> Result<Option<Checked<Vec<T>>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(leaf::<CheckedList<T>, D>(d)?.map(|l| l.0))
}

/// An object of objects by name (a device's `attributes`, `capacity`): a `null` value is
/// left out, one that is not an object reads as `T::default()`; empty when absent or not an
/// object.
pub fn map<'de, D, T>(d: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(leaf::<Members<T>, D>(d)?.map(|m| m.0).unwrap_or_default())
}

/// A list of strings, its other elements left out; empty when absent or not a list.
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let items = leaf::<List<Maybe<Text>>, D>(d)?.map(|l| l.0);
    Ok(items
        .into_iter()
        .flatten()
        .filter_map(|t| t.0)
        .map(|t| t.0)
        .collect())
}

/// A map of quantities (`consumedCapacity`): each value as text (a number as JSON spells
/// it); `None` when absent or not an object.
pub fn quantities<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let map = leaf::<Object<BTreeMap<String, QuantityText>>, D>(d)?;
    Ok(map.map(|m| m.0.into_iter().map(|(k, v)| (k, v.0)).collect()))
}

/// Reads `value` as `T` the way a tolerant field would: `T::default()` when it is not an
/// object (or, impossible for the model's types, does not read).
pub fn from_value<'de, T: Deserialize<'de> + Default>(value: &'de serde_json::Value) -> T {
    object(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    struct Inner {
        #[serde(default, deserialize_with = "string")]
        a: String,
    }

    #[derive(Debug, Default, PartialEq, Deserialize)]
    struct Probe {
        #[serde(default, deserialize_with = "string")]
        s: String,
        #[serde(default, deserialize_with = "opt_string")]
        o: Option<String>,
        #[serde(default, deserialize_with = "flag")]
        f: bool,
        #[serde(default, deserialize_with = "opt_object")]
        obj: Option<Inner>,
        #[serde(default, deserialize_with = "list")]
        l: Vec<Inner>,
        #[serde(default, deserialize_with = "opt_list")]
        ol: Option<Vec<Inner>>,
        #[serde(default, deserialize_with = "strings")]
        names: Vec<String>,
        #[serde(default, deserialize_with = "quantities")]
        q: Option<BTreeMap<String, String>>,
    }

    #[test]
    fn the_wrong_type_reads_as_absent() {
        let good: Probe = serde_json::from_value(json!({
            "s": "x", "o": "y", "f": true, "obj": {"a": "1"}, "l": [{"a": "2"}, 3],
            "ol": [], "names": ["n", 1, "m"], "q": {"memory": "1Gi", "cores": 30, "x": true}
        }))
        .unwrap();
        assert_eq!(good.s, "x");
        assert_eq!(good.o.as_deref(), Some("y"));
        assert!(good.f);
        assert_eq!(good.obj, Some(Inner { a: "1".into() }));
        assert_eq!(good.l, [Inner { a: "2".into() }, Inner::default()]);
        assert_eq!(good.ol, Some(vec![]));
        assert_eq!(good.names, ["n", "m"]);
        let q = good.q.unwrap();
        assert_eq!((q["memory"].as_str(), q["cores"].as_str()), ("1Gi", "30"));
        assert_eq!(q["x"], "true");

        let bad: Probe = serde_json::from_value(json!({
            "s": 1, "o": [1], "f": "true", "obj": "x", "l": {"a": "1"}, "ol": 5,
            "names": "n", "q": [1]
        }))
        .unwrap();
        assert_eq!(
            bad,
            Probe {
                ol: Some(vec![]),
                ..Probe::default()
            }
        );
        let nulls: Probe =
            serde_json::from_str(r#"{"s": null, "o": null, "obj": null, "ol": null}"#).unwrap();
        assert_eq!(nulls, Probe::default());
        assert_eq!(from_value::<Inner>(&json!("x")), Inner::default());
        assert_eq!(from_value::<Inner>(&json!({"a": "b"})).a, "b");
    }

    #[derive(Debug, Default, PartialEq, Deserialize)]
    struct Kept {
        #[serde(default, deserialize_with = "opt_int")]
        i: Option<i64>,
        #[serde(default, deserialize_with = "checked_list")]
        cl: Option<Checked<Vec<Inner>>>,
        #[serde(default, deserialize_with = "map")]
        m: BTreeMap<String, Inner>,
    }

    #[test]
    fn checked_lists_keep_the_wrong_type_and_maps_leave_out_null() {
        let read = |v: serde_json::Value| -> Kept {
            let from_text: Kept = serde_json::from_str(&v.to_string()).unwrap();
            let k: Kept = serde_json::from_value(v).unwrap();
            assert_eq!(k, from_text, "text and value read alike");
            k
        };
        let good = read(json!({
            "i": -3, "cl": [{"a": "1"}, null, 2], "m": {"x": {"a": "2"}, "y": 1, "z": null}
        }));
        assert_eq!(good.i, Some(-3));
        let elements = vec![Inner { a: "1".into() }, Inner::default(), Inner::default()];
        assert_eq!(good.cl, Some(Checked::Valid(elements)));
        assert_eq!(good.m.len(), 2);
        assert_eq!(
            (good.m["x"].a.as_str(), &good.m["y"]),
            ("2", &Inner::default())
        );

        for (i, cl) in [
            (json!(1.5), json!("x")),
            (json!(u64::MAX), json!(true)),
            (json!("1"), json!(7)),
            (json!([1]), json!({"a": "b"})),
        ] {
            let bad = read(json!({"i": i, "cl": cl.clone(), "m": []}));
            assert_eq!(
                bad,
                Kept {
                    cl: Some(Checked::Invalid(cl.into())),
                    ..Kept::default()
                }
            );
        }
        assert_eq!(
            read(json!({"i": null, "cl": null, "m": null})),
            Kept::default()
        );
    }
}
