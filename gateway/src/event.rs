//! Realtime event helpers: finding an event's `type` without parsing the
//! event, reading an `error` event's type and code, and building the
//! gateway's own `error` events.
//!
//! The relay never parses and re-serialises what it forwards; it only needs
//! the type of some frames (the first upstream event, the metered ones).
//! [`event_type`] reads it from the leading bytes: the first key, or the
//! second behind `event_id` (both the OpenAI server and its SDKs write one of
//! those two shapes). Anything else falls back to a borrowing serde parse that
//! skips every other value, which is still correct for any key order.

use std::borrow::Cow;

use serde::Deserialize;

/// The top-level `type` of a Realtime event, or `None` if `text` is not a
/// JSON object with a string `type`.
pub fn event_type(text: &str) -> Option<Cow<'_, str>> {
    if let Some(t) = leading_type(text.as_bytes()) {
        return Some(Cow::Borrowed(t_str(text, t)));
    }
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
    }
    serde_json::from_str::<Typed<'_>>(text).ok().map(|t| t.kind)
}

/// The event type when the leading bytes give it (first key, or second
/// behind `event_id`, no escapes), without any fallback. For callers that
/// only care about a few types and want to skip the full scan on the rest.
pub fn leading_event_type(text: &str) -> Option<&str> {
    leading_type(text.as_bytes()).map(|t| t_str(text, t))
}

/// [`leading_event_type`] on bytes that may not be UTF-8: the type's raw
/// bytes, unchecked (callers compare them with known types).
pub fn leading_event_type_bytes(text: &[u8]) -> Option<&[u8]> {
    leading_type(text).map(|(start, end)| &text[start..end])
}

fn t_str(text: &str, (start, end): (usize, usize)) -> &str {
    &text[start..end]
}

/// Byte range of the type value when it is the first key, or the second
/// behind `event_id`, and holds no escapes.
fn leading_type(b: &[u8]) -> Option<(usize, usize)> {
    // The compact shape OpenAI writes every event in: only the value is
    // scanned (what the general path below returns for it, one scan sooner).
    const COMPACT: &[u8] = b"{\"type\":\"";
    if b.starts_with(COMPACT) {
        return plain_string(b, COMPACT.len() - 1);
    }
    leading_type_any_spacing(b)
}

fn leading_type_any_spacing(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    for _ in 0..2 {
        i = skip_ws(b, i + 1);
        let (ks, ke) = plain_string(b, i)?;
        i = skip_ws(b, ke + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let (vs, ve) = plain_string(b, i)?;
        match &b[ks..ke] {
            b"type" => return Some((vs, ve)),
            b"event_id" => {
                i = skip_ws(b, ve + 1);
                if b.get(i) != Some(&b',') {
                    return None;
                }
            }
            _ => return None,
        }
    }
    None
}

/// A JSON string starting at `i` (the quote) without escapes: returns the
/// byte range of its content.
pub(crate) fn plain_string(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let start = i + 1;
    let len = memchr::memchr2(b'"', b'\\', b.get(start..)?)?;
    if b[start + len] == b'\\' {
        return None;
    }
    Some((start, start + len))
}

pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// A gateway-generated `error` event, in the shape the Realtime API uses.
pub fn error_event(kind: &str, code: &str, message: &str) -> String {
    serde_json::json!({
        "type": "error",
        "event_id": format!("event_patchbay_{}", crate::ids::short_id()),
        "error": {
            "type": kind,
            "code": code,
            "message": message,
            "param": null,
            "event_id": null,
        }
    })
    .to_string()
}

/// `error.type` and `error.code` of an `error` event.
pub fn error_kind(frame: &str) -> (Option<&str>, Option<&str>) {
    #[derive(serde::Deserialize)]
    struct Event<'a> {
        #[serde(borrow)]
        error: Option<Inner<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Inner<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a str>,
        #[serde(borrow)]
        code: Option<&'a str>,
    }
    match serde_json::from_str::<Event>(frame) {
        Ok(Event {
            error: Some(Inner { kind, code }),
        }) => (kind, code),
        _ => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_as_first_key() {
        assert_eq!(
            event_type(r#"{"type":"session.created","event_id":"e1"}"#).as_deref(),
            Some("session.created")
        );
    }

    #[test]
    fn type_behind_event_id() {
        assert_eq!(
            event_type(r#"{ "event_id" : "evt_1", "type" : "response.done", "response":{}}"#)
                .as_deref(),
            Some("response.done")
        );
    }

    #[test]
    fn type_elsewhere_is_found_by_the_fallback_and_nested_types_are_ignored() {
        let t = r#"{"session":{"type":"realtime"},"event_id":"e","type":"session.updated"}"#;
        assert_eq!(event_type(t).as_deref(), Some("session.updated"));
        let t = r#"{"error":{"type":"invalid_request_error"},"type":"error"}"#;
        assert_eq!(event_type(t).as_deref(), Some("error"));
    }

    #[test]
    fn escaped_type_value_is_decoded() {
        assert_eq!(event_type(r#"{"type":"a\u002eb"}"#).as_deref(), Some("a.b"));
    }

    /// The compact shape's shortcut finds what the general scan finds.
    #[test]
    fn the_compact_shortcut_agrees_with_the_general_scan() {
        const TAILS: [&str; 10] = [
            "response.output_audio.delta\",\"event_id\":\"e\"}",
            "\"",
            "",
            "a\\\"b\"",
            "x\" ,",
            "session.created\"}",
            "\\u002e\"",
            "no closing quote",
            "\u{e9}\"",
            "t\"}\"type\":\"u\"",
        ];
        for tail in TAILS {
            for prefix in ["{\"type\":\"", "{\"type\": \"", " {\"type\":\""] {
                let text = format!("{prefix}{tail}");
                let b = text.as_bytes();
                assert_eq!(leading_type(b), leading_type_any_spacing(b), "{text}");
            }
        }
    }

    #[test]
    fn not_an_event() {
        // The fast path reads only the leading bytes and does not validate
        // the rest of a frame: a truncated `{"type":"x"` still yields "x".
        for t in [
            "",
            "[]",
            "{}",
            "null",
            "{\"type\":1}",
            "{\"type\":",
            "\u{0}",
        ] {
            assert_eq!(event_type(t), None, "{t:?}");
        }
    }

    #[test]
    fn error_event_has_the_realtime_shape() {
        let e: serde_json::Value =
            serde_json::from_str(&error_event("invalid_request_error", "c", "m")).unwrap();
        assert_eq!(e["type"], "error");
        assert!(e["event_id"]
            .as_str()
            .unwrap()
            .starts_with("event_patchbay_"));
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["code"], "c");
        assert_eq!(e["error"]["message"], "m");
        assert!(e["error"]["param"].is_null());
    }
}
