//! The `POST /v1/realtime/client_secrets` body, validated as OpenAI does
//! (openai-python `client_secret_create_params.py`):
//!
//! ```json
//! {"expires_after": {"anchor": "created_at", "seconds": 600},
//!  "session": {"type": "realtime", "model": "gpt-realtime", "instructions": "…", …}}
//! ```
//!
//! Both fields are optional: `seconds` defaults to [`DEFAULT_TTL_SECS`] and
//! must be within [`MIN_TTL_SECS`]`..=`min([`MAX_TTL_SECS`], `max_ttl_secs`);
//! `session.type` defaults to `realtime`; `session.model` defaults to the
//! caller's default (the `?model=` route, else the first route) and must be
//! a route. A `transcription` session has no `session.model` (its model is
//! `session.audio.input.transcription.model`): its secret is bound to the
//! route configured with `intent = "transcription"`, and is refused when
//! there is none. Every other
//! `session` field is kept as given: it is the config sent upstream as a
//! `session.update`, and the upstream validates it. Each refusal names the
//! offending field in `param`. Pure: no I/O, exhaustively tested.

use http::StatusCode;
use serde_json::{Map, Value};

use crate::admission::Refusal;

/// `expires_after.seconds` when absent.
pub const DEFAULT_TTL_SECS: u64 = 600;
/// Shortest `expires_after.seconds` accepted.
pub const MIN_TTL_SECS: u64 = 10;
/// Longest `expires_after.seconds` OpenAI accepts (two hours).
pub const MAX_TTL_SECS: u64 = 7200;
/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A valid mint request.
#[derive(Debug, Clone, PartialEq)]
pub struct MintRequest {
    pub ttl_secs: u64,
    /// The route the secret is bound to.
    pub model: String,
    /// The session config as it will be echoed and applied: `type` and
    /// `model` filled in.
    pub session: Map<String, Value>,
}

fn bad(param: &str, message: impl Into<String>) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        message,
    )
    .with_param(param)
}

/// Parses and validates a mint body. `routes` are the served models,
/// `transcription_route` the route of `intent = "transcription"`.
pub fn parse(
    body: &[u8],
    default_model: &str,
    routes: &[&str],
    transcription_route: Option<&str>,
    max_ttl_secs: u64,
) -> Result<MintRequest, Refusal> {
    let (ttl_secs, mut session) = top_level(body, max_ttl_secs)?;
    let transcription = match session.get("type") {
        None => false,
        Some(Value::String(t)) if t == "realtime" => false,
        Some(Value::String(t)) if t == "transcription" => true,
        Some(_) => {
            return Err(bad(
                "session.type",
                "session.type must be \"realtime\" or \"transcription\"",
            ))
        }
    };
    let model = if transcription {
        // OpenAI's transcription session config names no model of its own
        // (openai-python `realtime_transcription_session_create_request.py`):
        // the secret is bound to the route configured for the intent.
        if session.contains_key("model") {
            return Err(bad(
                "session.model",
                "a transcription session has no session.model: name the model in session.audio.input.transcription.model",
            ));
        }
        transcription_route
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "unsupported_session_type",
                    "no route of this gateway serves transcription sessions: configure a route with intent = \"transcription\"",
                )
                .with_param("session.type")
            })?
            .to_string()
    } else {
        let model = match session.get("model") {
            None | Some(Value::Null) => default_model.to_string(),
            Some(Value::String(m)) => m.clone(),
            Some(_) => return Err(bad("session.model", "session.model must be a string")),
        };
        if !routes.contains(&model.as_str()) {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("the model '{model}' is not served by this gateway"),
            )
            .with_param("session.model"));
        }
        session.insert("model".into(), Value::String(model.clone()));
        model
    };
    let kind = if transcription {
        "transcription"
    } else {
        "realtime"
    };
    session.insert("type".into(), Value::String(kind.into()));
    Ok(MintRequest {
        ttl_secs,
        model,
        session,
    })
}

impl MintRequest {
    /// The minted config as the `session.update` that applies it (GA), for
    /// the checks a client's own `session.update` gets.
    pub fn as_update(&self) -> String {
        serde_json::json!({"type": "session.update", "session": self.session}).to_string()
    }
}

/// The body's two fields: the TTL and the session object.
fn top_level(body: &[u8], max_ttl_secs: u64) -> Result<(u64, Map<String, Value>), Refusal> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(body).map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_json",
                format!("the request body is not valid JSON: {e}"),
            )
        })?
    };
    let Value::Object(mut top) = value else {
        return Err(bad("", "the request body must be a JSON object"));
    };
    if let Some(unknown) = top
        .keys()
        .find(|k| !matches!(k.as_str(), "expires_after" | "session"))
    {
        let unknown = unknown.clone();
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "unknown_parameter",
            format!("Unknown parameter: '{unknown}'."),
        )
        .with_param(&unknown));
    }
    let ttl_secs = ttl(top.remove("expires_after"), max_ttl_secs)?;
    let session = match top.remove("session") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(s)) => s,
        Some(_) => return Err(bad("session", "session must be an object")),
    };
    Ok((ttl_secs, session))
}

/// Parses and validates a translation mint body
/// (`POST /v1/realtime/translations/client_secrets`; openai-python
/// `types/realtime/translations/client_secret_create_params.py`): the same
/// `expires_after`, and a `session` that must name its `model`, one of the
/// translation routes (`translation_routes`).
pub fn parse_translation(
    body: &[u8],
    translation_routes: &[&str],
    max_ttl_secs: u64,
) -> Result<MintRequest, Refusal> {
    let (ttl_secs, session) = top_level(body, max_ttl_secs)?;
    let model = match session.get("model") {
        Some(Value::String(m)) => m.clone(),
        None | Some(Value::Null) => {
            return Err(bad("session.model", "session.model is required"));
        }
        Some(_) => return Err(bad("session.model", "session.model must be a string")),
    };
    if !translation_routes.contains(&model.as_str()) {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!(
                "the model '{model}' is not served at /v1/realtime/translations by this gateway"
            ),
        )
        .with_param("session.model"));
    }
    Ok(MintRequest {
        ttl_secs,
        model,
        session,
    })
}

fn ttl(expires_after: Option<Value>, max_ttl_secs: u64) -> Result<u64, Refusal> {
    let mut e = match expires_after {
        None | Some(Value::Null) => return Ok(DEFAULT_TTL_SECS.min(max_ttl_secs)),
        Some(Value::Object(e)) => e,
        Some(_) => return Err(bad("expires_after", "expires_after must be an object")),
    };
    match e.remove("anchor") {
        None | Some(Value::Null) => {}
        Some(Value::String(a)) if a == "created_at" => {}
        Some(_) => {
            return Err(bad(
                "expires_after.anchor",
                "expires_after.anchor must be \"created_at\"",
            ))
        }
    }
    let max = max_ttl_secs.min(MAX_TTL_SECS);
    let secs = match e.remove("seconds") {
        None | Some(Value::Null) => DEFAULT_TTL_SECS.min(max),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(s) if (MIN_TTL_SECS..=max).contains(&s) => s,
            _ => {
                return Err(bad(
                    "expires_after.seconds",
                    format!(
                        "expires_after.seconds must be a whole number from {MIN_TTL_SECS} to {max}"
                    ),
                ))
            }
        },
        Some(_) => {
            return Err(bad(
                "expires_after.seconds",
                "expires_after.seconds must be a number",
            ))
        }
    };
    if let Some(unknown) = e.keys().next() {
        return Err(bad(
            &format!("expires_after.{unknown}"),
            format!("Unknown parameter: 'expires_after.{unknown}'."),
        ));
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ROUTES: &[&str] = &["gpt-realtime", "gpt-realtime-mini"];

    fn p(body: &str) -> Result<MintRequest, Refusal> {
        parse(body.as_bytes(), "gpt-realtime", ROUTES, None, 7200)
    }

    fn param(r: &Refusal) -> &str {
        r.param.as_deref().unwrap_or("")
    }

    #[test]
    fn an_empty_body_mints_the_defaults() {
        for body in [
            "",
            "  \n",
            "{}",
            r#"{"session": null, "expires_after": null}"#,
        ] {
            let m = p(body).unwrap();
            assert_eq!(m.ttl_secs, DEFAULT_TTL_SECS, "{body:?}");
            assert_eq!(m.model, "gpt-realtime");
            assert_eq!(
                Value::Object(m.session),
                json!({"type": "realtime", "model": "gpt-realtime"})
            );
        }
    }

    #[test]
    fn session_fields_are_kept_and_model_and_type_filled_in() {
        let m = p(
            r#"{"expires_after": {"anchor": "created_at", "seconds": 10},
                      "session": {"model": "gpt-realtime-mini", "instructions": "Be brief.",
                                  "audio": {"output": {"voice": "marin"}}}}"#,
        )
        .unwrap();
        assert_eq!(m.ttl_secs, 10);
        assert_eq!(m.model, "gpt-realtime-mini");
        assert_eq!(m.session["instructions"], "Be brief.");
        assert_eq!(m.session["audio"]["output"]["voice"], "marin");
        assert_eq!(m.session["type"], "realtime");
    }

    #[test]
    fn ttl_bounds_are_enforced_by_name() {
        for (body, ok) in [
            (r#"{"expires_after": {"seconds": 9}}"#, false),
            (r#"{"expires_after": {"seconds": 10}}"#, true),
            (r#"{"expires_after": {"seconds": 7200}}"#, true),
            (r#"{"expires_after": {"seconds": 7201}}"#, false),
            (r#"{"expires_after": {"seconds": -5}}"#, false),
            (r#"{"expires_after": {"seconds": 60.5}}"#, false),
            (r#"{"expires_after": {"seconds": "60"}}"#, false),
        ] {
            match p(body) {
                Ok(_) => assert!(ok, "{body} accepted"),
                Err(r) => {
                    assert!(!ok, "{body} refused: {}", r.message);
                    assert_eq!(r.status, StatusCode::BAD_REQUEST);
                    assert_eq!(param(&r), "expires_after.seconds", "{body}");
                }
            }
        }
        // max_ttl_secs caps below OpenAI's two hours, and caps the default.
        let r = parse(
            br#"{"expires_after": {"seconds": 301}}"#,
            "gpt-realtime",
            ROUTES,
            None,
            300,
        )
        .unwrap_err();
        assert!(r.message.contains("10 to 300"), "{}", r.message);
        assert_eq!(
            parse(b"{}", "gpt-realtime", ROUTES, None, 300)
                .unwrap()
                .ttl_secs,
            300
        );
    }

    #[test]
    fn bad_shapes_name_their_field() {
        for (body, status, field) in [
            ("[1]", 400, ""),
            ("{", 400, ""),
            (r#"{"x": 1}"#, 400, "x"),
            (r#"{"expires_after": 5}"#, 400, "expires_after"),
            (
                r#"{"expires_after": {"anchor": "now"}}"#,
                400,
                "expires_after.anchor",
            ),
            (
                r#"{"expires_after": {"seconds": 60, "z": 1}}"#,
                400,
                "expires_after.z",
            ),
            (r#"{"session": "realtime"}"#, 400, "session"),
            (
                r#"{"session": {"type": "transcription"}}"#,
                400,
                "session.type",
            ),
            (r#"{"session": {"type": "other"}}"#, 400, "session.type"),
            (r#"{"session": {"model": 5}}"#, 400, "session.model"),
            (r#"{"session": {"model": "gpt-4o"}}"#, 404, "session.model"),
        ] {
            let r = p(body).unwrap_err();
            assert_eq!(r.status.as_u16(), status, "{body}: {}", r.message);
            assert_eq!(param(&r), field, "{body}");
        }
        let r = p(r#"{"session": {"type": "transcription"}}"#).unwrap_err();
        assert_eq!(r.code, "unsupported_session_type");
        assert!(
            r.message.contains("intent = \"transcription\""),
            "{}",
            r.message
        );
        let r = p(r#"{"session": {"model": "gpt-4o"}}"#).unwrap_err();
        assert_eq!(r.code, "model_not_found");
    }

    #[test]
    fn a_transcription_secret_is_bound_to_the_transcription_route() {
        let t = |body: &str| {
            parse(
                body.as_bytes(),
                "gpt-realtime",
                ROUTES,
                Some("transcribe"),
                7200,
            )
        };
        let m = t(r#"{"session": {"type": "transcription",
                     "audio": {"input": {"transcription": {"model": "gpt-realtime-whisper"}}}}}"#)
        .unwrap();
        assert_eq!(m.model, "transcribe");
        assert_eq!(m.session["type"], "transcription");
        assert!(m.session.get("model").is_none(), "{:?}", m.session);
        let update: Value = serde_json::from_str(&m.as_update()).unwrap();
        assert_eq!(
            update["session"]["audio"]["input"]["transcription"]["model"],
            "gpt-realtime-whisper"
        );
        let r =
            t(r#"{"session": {"type": "transcription", "model": "gpt-realtime"}}"#).unwrap_err();
        assert_eq!((r.status.as_u16(), param(&r)), (400, "session.model"));
        // A realtime secret is unchanged by the transcription route.
        assert_eq!(t("{}").unwrap().model, "gpt-realtime");
    }
}
