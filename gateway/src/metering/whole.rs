//! An event's `usage` object read in the event's own pass, whole or not at
//! all: the result is exactly what parsing the object's text on its own as
//! a [`UsageJson`] gives (`None` where that fails), so one odd field (a
//! string, a negative or fractional number, a duplicate key, an object
//! where a count belongs) makes the whole usage unknown and never loses the
//! rest of the event. One difference: the derived impl also reads a struct
//! from a JSON array, positionally (`[10, 6, 4]`); here an array where an
//! object belongs is odd like any other wrong shape (no API sends usage as
//! an array).
//!
//! Before, the object was taken as a `RawValue` (skipped once, copied) and
//! parsed a second time; this reads it once, which was ~4,000 of the
//! ~16,000 instructions a `response.done` cost.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::pricing::{CachedDetails, InputDetails, OutputDetails, UsageJson};

/// `deserialize_with` for a `usage` field; see the module docs.
pub(super) fn usage<'de, D: Deserializer<'de>>(d: D) -> Result<Option<UsageJson>, D::Error> {
    Ok(d.deserialize_any(Object::<UsageJson>(PhantomData))?
        .flatten())
}

/// What one value was: `None` when it is not of the field's shape.
type Shaped<T> = Option<T>;

/// A struct of optional counts and nested objects, filled field by field.
trait Fields: Default {
    const NAMES: &'static [&'static str];

    /// Reads the value of field `i`; `false` when it is not of its shape.
    fn set<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<bool, A::Error>;
}

fn count<'de, A: MapAccess<'de>>(slot: &mut Option<u64>, map: &mut A) -> Result<bool, A::Error> {
    Ok(match map.next_value_seed(Count)? {
        Some(v) => {
            *slot = v;
            true
        }
        None => false,
    })
}

fn object<'de, A: MapAccess<'de>, T: Fields>(
    slot: &mut Option<T>,
    map: &mut A,
) -> Result<bool, A::Error> {
    Ok(match map.next_value_seed(Object::<T>(PhantomData))? {
        Some(v) => {
            *slot = v;
            true
        }
        None => false,
    })
}

impl Fields for UsageJson {
    const NAMES: &'static [&'static str] = &[
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "input_token_details",
        "output_token_details",
        "seconds",
    ];

    fn set<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<bool, A::Error> {
        match i {
            0 => count(&mut self.total_tokens, map),
            1 => count(&mut self.input_tokens, map),
            2 => count(&mut self.output_tokens, map),
            3 => object(&mut self.input_token_details, map),
            4 => object(&mut self.output_token_details, map),
            _ => Ok(match map.next_value_seed(Seconds)? {
                Some(v) => {
                    self.seconds = v;
                    true
                }
                None => false,
            }),
        }
    }
}

impl Fields for InputDetails {
    const NAMES: &'static [&'static str] = &[
        "text_tokens",
        "audio_tokens",
        "image_tokens",
        "cached_tokens",
        "cached_tokens_details",
    ];

    fn set<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<bool, A::Error> {
        match i {
            0 => count(&mut self.text_tokens, map),
            1 => count(&mut self.audio_tokens, map),
            2 => count(&mut self.image_tokens, map),
            3 => count(&mut self.cached_tokens, map),
            _ => object(&mut self.cached_tokens_details, map),
        }
    }
}

impl Fields for CachedDetails {
    const NAMES: &'static [&'static str] = &["text_tokens", "audio_tokens", "image_tokens"];

    fn set<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<bool, A::Error> {
        match i {
            0 => count(&mut self.text_tokens, map),
            1 => count(&mut self.audio_tokens, map),
            _ => count(&mut self.image_tokens, map),
        }
    }
}

impl Fields for OutputDetails {
    const NAMES: &'static [&'static str] = &["text_tokens", "audio_tokens"];

    fn set<'de, A: MapAccess<'de>>(&mut self, i: usize, map: &mut A) -> Result<bool, A::Error> {
        match i {
            0 => count(&mut self.text_tokens, map),
            _ => count(&mut self.audio_tokens, map),
        }
    }
}

/// Any value, as the shape-or-not of what a derived `Deserialize` expects.
macro_rules! odd_scalars {
    ($($name:ident: $t:ty),*) => {
        $(fn $name<E: serde::de::Error>(self, _: $t) -> Result<Self::Value, E> {
            Ok(None)
        })*
    };
}

/// An `Option<u64>` field: a count or `null`; anything else is odd.
struct Count;

impl<'de> DeserializeSeed<'de> for Count {
    type Value = Shaped<Option<u64>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count {
    type Value = Shaped<Option<u64>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Some(v)))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Some(None))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Some(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    odd_scalars!(visit_bool: bool, visit_i64: i64, visit_f64: f64, visit_str: &str);

    fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(a).map(|_| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(a).map(|_| None)
    }
}

/// An `Option<f64>` field (a duration's `seconds`): any number or `null`;
/// anything else is odd.
struct Seconds;

impl<'de> DeserializeSeed<'de> for Seconds {
    type Value = Shaped<Option<f64>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seconds {
    type Value = Shaped<Option<f64>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Some(v as f64)))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Some(v as f64)))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(Some(v)))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Some(None))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Some(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    odd_scalars!(visit_bool: bool, visit_str: &str);

    fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(a).map(|_| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(a).map(|_| None)
    }
}

/// An `Option<T>` field: `T`'s object (every field of its shape, none
/// twice) or `null`; anything else is odd.
struct Object<T>(PhantomData<T>);

impl<'de, T: Fields> DeserializeSeed<'de> for Object<T> {
    type Value = Shaped<Option<T>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: Fields> Visitor<'de> for Object<T> {
    type Value = Shaped<Option<T>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut value = T::default();
        let mut seen = 0u32;
        let mut shaped = true;
        while let Some(key) = map.next_key_seed(Key(T::NAMES))? {
            match key {
                Some(i) if seen & (1 << i) == 0 => {
                    seen |= 1 << i;
                    shaped &= value.set(i, &mut map)?;
                }
                // A field given twice: the derived impl refuses the object.
                Some(_) => {
                    map.next_value::<IgnoredAny>()?;
                    shaped = false;
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(shaped.then_some(Some(value)))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Some(None))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Some(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    odd_scalars!(
        visit_bool: bool,
        visit_i64: i64,
        visit_u64: u64,
        visit_f64: f64,
        visit_str: &str
    );

    fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_seq(a).map(|_| None)
    }
}

/// A key: the index of the field it names, or `None` for another key.
struct Key(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|n| *n == v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::testing::Rng;

    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(default, deserialize_with = "usage")]
        usage: Option<UsageJson>,
        #[serde(default)]
        after: Option<String>,
    }

    /// What the usage object's text parsed on its own gives (the rule).
    fn reference(raw: &str) -> Option<UsageJson> {
        serde_json::from_str::<UsageJson>(raw).ok()
    }

    fn one_pass(raw: &str) -> Option<UsageJson> {
        let event = format!("{{\"usage\": {raw}, \"after\": \"kept\"}}");
        let h: Holder = serde_json::from_str(&event).expect("the event parses");
        assert_eq!(h.after.as_deref(), Some("kept"), "{raw}");
        h.usage
    }

    #[test]
    fn named_cases_match_a_parse_of_the_object_alone() {
        let full = r#"{"total_tokens": 10, "input_tokens": 6, "output_tokens": 4,
            "input_token_details": {"text_tokens": 2, "audio_tokens": 4, "image_tokens": 0,
                "cached_tokens": 1, "cached_tokens_details": {"text_tokens": 1, "audio_tokens": 0}},
            "output_token_details": {"text_tokens": 1, "audio_tokens": 3}, "type": "tokens"}"#;
        assert!(one_pass(full).unwrap().input_token_details.is_some());
        for raw in [
            full,
            "{}",
            "null",
            "5",
            "\"usage\"",
            "true",
            r#"{"input_tokens": null}"#,
            r#"{"input_tokens": -1}"#,
            r#"{"input_tokens": 1.5}"#,
            r#"{"input_tokens": 1e3}"#,
            r#"{"input_tokens": "12"}"#,
            r#"{"input_tokens": 18446744073709551615}"#,
            r#"{"input_tokens": 18446744073709551616}"#,
            r#"{"input_tokens": 1, "input_tokens": 2}"#,
            r#"{"input_token_details": null}"#,
            r#"{"input_token_details": 3}"#,
            r#"{"input_token_details": {"audio_tokens": true}}"#,
            r#"{"input_token_details": {"cached_tokens_details": {"image_tokens": 4}}}"#,
            r#"{"output_token_details": {"audio_tokens": 7, "extra": {"deep": [1, {"a": null}]}}}"#,
            r#"{"input\u005ftokens": 9}"#,
            r#"{"unknown": {"input_tokens": "x"}, "output_tokens": 2}"#,
        ] {
            assert_eq!(one_pass(raw), reference(raw), "{raw}");
        }
        // The one difference: an array where an object belongs.
        for raw in [
            "[1, 2]",
            r#"{"input_token_details": []}"#,
            r#"{"output_token_details": [3, 4]}"#,
            r#"{"input_token_details": {"cached_tokens_details": []}}"#,
        ] {
            assert!(reference(raw).is_some(), "{raw}");
            assert_eq!(one_pass(raw), None, "{raw}");
        }
    }

    const KEYS: [&str; 10] = [
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "input_token_details",
        "output_token_details",
        "text_tokens",
        "audio_tokens",
        "cached_tokens",
        "cached_tokens_details",
        "other",
    ];

    const SCALARS: [&str; 8] = ["0", "7", "null", "-3", "2.5", "\"9\"", "true", "1e2"];

    /// A value for `key`: arrays only under a key no struct has (where both
    /// skip them; at a field's place see the named cases).
    fn value(rng: &mut Rng, key: &str, depth: usize, out: &mut String) {
        if key == "other" && rng.below(2) == 0 {
            out.push_str("[1, {\"a\": []}]");
        } else if depth < 3 && rng.below(3) == 0 {
            object(rng, depth + 1, out);
        } else {
            out.push_str(SCALARS[rng.below(SCALARS.len() as u64) as usize]);
        }
    }

    fn object(rng: &mut Rng, depth: usize, out: &mut String) {
        out.push('{');
        for i in 0..rng.below(6) {
            if i > 0 {
                out.push(',');
            }
            let key = KEYS[rng.below(KEYS.len() as u64) as usize];
            out.push('"');
            out.push_str(key);
            out.push_str("\":");
            value(rng, key, depth, out);
        }
        out.push('}');
    }

    #[test]
    fn random_objects_match_a_parse_of_the_object_alone() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let (mut some, mut none) = (0, 0);
        for _ in 0..20_000 {
            let mut raw = String::new();
            object(&mut rng, 0, &mut raw);
            let expected = reference(&raw);
            match expected {
                Some(_) => some += 1,
                None => none += 1,
            }
            assert_eq!(one_pass(&raw), expected, "{raw}");
        }
        // Both outcomes were exercised, many times.
        assert!(some > 1_000 && none > 1_000, "{some} {none}");
    }
}
