//! Tolerant leaves for the DRA model: serde `deserialize_with` functions that read a field
//! of the wrong JSON type as absent, the way indexing a `serde_json::Value` did (`v["x"]`
//! of a number is `Null`, `as_str()` of a number is `None`).
//!
//! With every field of the model read through these (or as a `serde_json::Value`), any
//! JSON object reads as a claim or a class: what is wrong with a field is found by the code
//! that uses it, which names the field, and not by the parser, which cannot. The API server
//! validates objects against their schema, so in a cluster the fallbacks never fire; they
//! keep hand-written and test objects, and the controller's messages about them, as they
//! were.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a leaf makes of each JSON shape: `None` for a shape it does not take (the field
/// then reads as its default).
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
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    /// An array.
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
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

fn leaf<'de, T: Leaf<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
    d.deserialize_any(LeafVisitor(PhantomData))
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

/// An object leaf: the struct (or map) `T`.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Leaf<'de> for Object<T> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Option<Self>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(|t| Some(Self(t)))
    }
}

/// An array leaf whose elements are read by `E`.
struct List<E>(Vec<E>);

impl<'de, E: Deserialize<'de>> Leaf<'de> for List<E> {
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
        Vec::<E>::deserialize(SeqAccessDeserializer::new(seq)).map(|v| Some(Self(v)))
    }
}

/// One element of a list of objects: any JSON value, read as `T` when it is an object and
/// as `T::default()` otherwise.
struct Element<T>(T);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(
            leaf::<Object<T>, D>(d)?.map(|o| o.0).unwrap_or_default(),
        ))
    }
}

/// One element of a list of strings: `None` when it is not a string.
struct TextElement(Option<String>);

impl<'de> Deserialize<'de> for TextElement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(leaf::<Text, D>(d)?.map(|t| t.0)))
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
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Some(Self("{...}".to_owned())))
    }
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Option<Self>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Some(Self("[...]".to_owned())))
    }
}

impl<'de> Deserialize<'de> for QuantityText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(leaf::<Self, D>(d)?.unwrap_or_else(|| Self("null".to_owned())))
    }
}

/// A string; `""` when absent or not a string.
pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(leaf::<Text, D>(d)?.map(|t| t.0).unwrap_or_default())
}

/// A string; `None` when absent or not a string.
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(leaf::<Text, D>(d)?.map(|t| t.0))
}

/// `true` only for JSON `true`.
pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(leaf::<Flag, D>(d)?.is_some_and(|f| f.0))
}

/// A boolean; `None` when absent or not a boolean.
pub fn opt_flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(leaf::<Flag, D>(d)?.map(|f| f.0))
}

/// An object read as `T`; `T::default()` when absent or not an object.
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(leaf::<Object<T>, D>(d)?.map(|o| o.0).unwrap_or_default())
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
    struct Present<E>(Vec<E>);
    impl<'de, E: Deserialize<'de> + Default> Leaf<'de> for Present<E> {
        fn from_str(_: &str) -> Option<Self> {
            Some(Self(Vec::new()))
        }
        fn from_bool(_: bool) -> Option<Self> {
            Some(Self(Vec::new()))
        }
        fn from_number(_: serde_json::Number) -> Option<Self> {
            Some(Self(Vec::new()))
        }
        fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Option<Self>, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Some(Self(Vec::new())))
        }
        fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Option<Self>, A::Error> {
            let items = List::<Element<E>>::from_seq(seq)?.map(|l| l.0);
            Ok(items.map(|v| Self(v.into_iter().map(|e| e.0).collect())))
        }
    }
    Ok(leaf::<Present<T>, D>(d)?.map(|p| p.0))
}

/// A list of strings, its other elements left out; empty when absent or not a list.
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let items = leaf::<List<TextElement>, D>(d)?.map(|l| l.0);
    Ok(items.into_iter().flatten().filter_map(|t| t.0).collect())
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
}
