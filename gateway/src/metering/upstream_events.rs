//! The upstream events the turn tracker deserialises ([`super::tracker`]),
//! each into a struct that names only the fields metering reads and skips
//! every other one (openai-python's `types/realtime/` names each shape):
//! `response.created` and `response.done` (`realtime_response.py`: the
//! response's id, conversation id, status and usage), the input
//! transcription's usage, and a session event's transcription model.
//!
//! Every field is lenient: absent, null or of an unexpected shape it is
//! `None`, so one odd field never loses the rest of the event (and so
//! never the turn's bill).

use serde::{Deserialize, Deserializer};

use super::pricing::UsageJson;

/// A field that is `None` when absent, null or of an unexpected shape, so
/// one odd field never loses the rest of the event. The field's JSON is
/// taken as it is (a [`RawValue`]: one copy of its text) and parsed on its
/// own, rather than built into a `serde_json::Value` tree first (an
/// allocation per node, for subtrees such as a session's audio config).
///
/// [`RawValue`]: serde_json::value::RawValue
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
    Ok(serde_json::from_str(raw.get()).ok())
}

/// [`lenient`] for a string field, without the raw copy: a string is
/// taken, anything else (a number, an object, null) is skipped as `None`.
fn lenient_string<'de, D>(d: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    struct StringOrSkip;

    impl<'de> serde::de::Visitor<'de> for StringOrSkip {
        type Value = Option<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }

        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(v))
        }

        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(self)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
            serde::de::IgnoredAny.visit_seq(a).map(|_| None)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<Self::Value, A::Error> {
            serde::de::IgnoredAny.visit_map(a).map(|_| None)
        }
    }

    d.deserialize_any(StringOrSkip)
}

#[derive(Deserialize)]
pub(super) struct CreatedEvent {
    #[serde(default)]
    pub(super) response: Option<ResponseHead>,
}

#[derive(Deserialize)]
pub(super) struct ResponseHead {
    #[serde(default, deserialize_with = "lenient_string")]
    pub(super) id: Option<String>,
    /// [`DoneResponse::conversation_id`], as `response.created` names it.
    #[serde(default, deserialize_with = "lenient_string")]
    pub(super) conversation_id: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct DoneEvent {
    #[serde(default)]
    pub(super) response: Option<DoneResponse>,
}

#[derive(Deserialize, Default)]
pub(super) struct DoneResponse {
    #[serde(default, deserialize_with = "lenient_string")]
    pub(super) id: Option<String>,
    /// The conversation the response was added to: openai-python's
    /// `types/realtime/realtime_response.py` (`RealtimeResponse.conversation_id`,
    /// carried by `response.created` and `response.done`), an id like
    /// `conv_1234` for the session's default conversation and null for a
    /// response created out of band (`"conversation": "none"`).
    #[serde(default, deserialize_with = "lenient_string")]
    pub(super) conversation_id: Option<String>,
    #[serde(default, deserialize_with = "lenient_string")]
    pub(super) status: Option<String>,
    #[serde(default, deserialize_with = "super::whole::usage")]
    pub(super) usage: Option<UsageJson>,
}

#[derive(Deserialize)]
pub(super) struct TranscriptionEvent {
    #[serde(default, deserialize_with = "super::whole::usage")]
    pub(super) usage: Option<UsageJson>,
}

#[derive(Deserialize)]
pub(super) struct SessionEvent {
    #[serde(default)]
    pub(super) session: Option<SessionObject>,
}

#[derive(Deserialize)]
pub(super) struct SessionObject {
    #[serde(default, deserialize_with = "lenient")]
    pub(super) audio: Option<AudioConfig>,
    #[serde(default, deserialize_with = "lenient")]
    pub(super) input_audio_transcription: Option<TranscriptionConfig>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AudioConfig {
    pub(super) input: Option<AudioInput>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AudioInput {
    pub(super) transcription: Option<TranscriptionConfig>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct TranscriptionConfig {
    pub(super) model: Option<String>,
}
