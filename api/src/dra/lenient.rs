//! Field readers that never fail on a value of the wrong JSON type, for the tolerant
//! object models of this module ([`super::slice`]). Each says what it makes of an odd value:
//! absent (`None`), the type's default, or [`RawJson`] kept for the reader to report.
//!
//! They are used with `#[serde(default, deserialize_with = "...")]`, so that a missing field
//! reads as the default too.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Checked<T> {
    /// The field as the model reads it.
    Valid(T),
    /// A value of another JSON type.
    Invalid(RawJson),
}

/// A scalar (string, bool, integer) of type `T`, or whatever else.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar<T> {
    Is(T),
    Not(IgnoredAny),
}

/// `Some` for a value of type `T`; `None` for null or a value of any other type.
pub(crate) fn scalar<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(match Scalar::<T>::deserialize(d)? {
        Scalar::Is(v) => Some(v),
        Scalar::Not(_) => None,
    })
}

/// What a value is to a reader that wants an object.
enum Shape<T> {
    /// Null.
    Null,
    /// An object, read as `T`.
    Object(T),
    /// A list or a scalar (read past).
    Other,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shape<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor(PhantomData))
    }
}

struct ShapeVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ShapeVisitor<T> {
    type Value = Shape<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Shape::Object)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Shape::Other)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Shape::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Shape::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Shape::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Shape::Other)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Shape::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Shape::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Shape::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// `Some` for an object; `None` for anything else.
pub(crate) fn optional_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(match Shape::<T>::deserialize(d)? {
        Shape::Object(v) => Some(v),
        Shape::Null | Shape::Other => None,
    })
}

/// An object; anything else reads as `T::default()`.
pub(crate) fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    optional_object(d).map(Option::unwrap_or_default)
}

/// An element of a list or a map's value: `None` for null, `T` for an object, `T::default()`
/// for anything else.
struct Element<T>(Option<T>);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(match Shape::<T>::deserialize(d)? {
            Shape::Null => None,
            Shape::Object(v) => Some(v),
            Shape::Other => Some(T::default()),
        }))
    }
}

/// A list whose elements are objects, or [`RawJson`] for a value that is not a list; `None`
/// for null. An element that is not an object reads as `T::default()`, so that elements
/// keep their index.
struct ListVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for ListVisitor<T> {
    type Value = Option<Checked<Vec<T>>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Element(e)) = seq.next_element::<Element<T>>()? {
            out.push(e.unwrap_or_default());
        }
        Ok(Some(Checked::Valid(out)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let v = serde_json::Value::deserialize(MapAccessDeserializer::new(map))?;
        Ok(Some(Checked::Invalid(v.into())))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(Checked::Invalid(serde_json::Value::from(v).into())))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Checked::Invalid(serde_json::Value::from(v).into())))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Checked::Invalid(serde_json::Value::from(v).into())))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(Checked::Invalid(serde_json::Value::from(v).into())))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Checked::Invalid(serde_json::Value::from(v).into())))
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
}

/// A list of objects, [`Checked::Invalid`] for anything but a list, `None` for null.
pub(crate) fn checked_list<'de, D, T>(d: D) -> Result<Option<Checked<Vec<T>>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    d.deserialize_any(ListVisitor(PhantomData))
}

/// A list of objects; anything else reads as an empty list.
pub(crate) fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(match checked_list(d)? {
        Some(Checked::Valid(v)) => v,
        _ => Vec::new(),
    })
}

/// An object of objects by name: a null value is left out, one that is not an object reads
/// as `T::default()`; anything but an object reads as an empty map.
pub(crate) fn map<'de, D, T>(d: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    struct Entries<T>(BTreeMap<String, T>);
    impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Entries<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(PhantomData<T>);
            impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
                type Value = Entries<T>;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object")
                }

                fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                    let mut out = BTreeMap::new();
                    while let Some((k, Element(v))) = m.next_entry::<String, Element<T>>()? {
                        if let Some(v) = v {
                            out.insert(k, v);
                        }
                    }
                    Ok(Entries(out))
                }
            }
            d.deserialize_map(V(PhantomData))
        }
    }
    Ok(optional_object::<D, Entries<T>>(d)?.map_or_else(BTreeMap::new, |e| e.0))
}
