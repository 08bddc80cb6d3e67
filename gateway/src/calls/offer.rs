//! Reading a call offer: the body of `POST /v1/realtime/calls` in the three
//! shapes clients send, and the multipart body the gateway forwards.
//!
//! - `multipart/form-data` with a part `sdp` and an optional part `session`
//!   (JSON): what openai-python 3.x sends when a session config is given;
//! - `application/json` `{"sdp": "...", "session": {...}}` (older clients);
//! - `application/sdp` (or `text/plain`) with the SDP as the whole body:
//!   browsers following OpenAI's WebRTC guide, and openai-python without a
//!   session config.
//!
//! Pure functions: no I/O, every failure an [`OfferError`] the API turns into
//! an OpenAI-style 400/413/415. An SDP is accepted when it starts with
//! `v=0` and has at least one `m=` line; anything else is not an offer.

use serde_json::{Map, Value};

/// The largest SDP (and the largest request body) accepted.
pub const MAX_SDP_BYTES: usize = 64 * 1024;
/// The largest request body read: an SDP of [`MAX_SDP_BYTES`] plus a session
/// config and multipart framing.
pub const MAX_BODY_BYTES: usize = MAX_SDP_BYTES + 64 * 1024;

/// An offer as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub sdp: String,
    /// The `session` config, when one was sent.
    pub session: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OfferError {
    #[error("the SDP offer is larger than {MAX_SDP_BYTES} bytes")]
    TooLarge,
    #[error("unsupported Content-Type '{0}': send multipart/form-data, application/json or application/sdp")]
    UnsupportedType(String),
    #[error("malformed multipart body: {0}")]
    Multipart(&'static str),
    #[error("malformed JSON body: {0}")]
    Json(String),
    #[error("missing required parameter: 'sdp'")]
    MissingSdp,
    #[error("'session' must be a JSON object")]
    SessionNotObject,
    #[error(
        "the 'sdp' parameter is not an SDP offer (it must start with v=0 and have an m= line)"
    )]
    NotSdp,
}

impl OfferError {
    /// The request field at fault, for the error's `param`.
    pub fn param(&self) -> &'static str {
        match self {
            OfferError::MissingSdp | OfferError::NotSdp | OfferError::TooLarge => "sdp",
            OfferError::SessionNotObject => "session",
            _ => "",
        }
    }
}

/// Parses a body by its `Content-Type`.
pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Offer, OfferError> {
    let ct = content_type.unwrap_or("").trim();
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let offer = match mime.as_str() {
        "multipart/form-data" => {
            let boundary = param_of(ct, "boundary").ok_or(OfferError::Multipart("no boundary"))?;
            parse_multipart(body, &boundary)?
        }
        "application/json" => parse_json(body)?,
        "application/sdp" | "text/plain" => Offer {
            sdp: String::from_utf8(body.to_vec()).map_err(|_| OfferError::NotSdp)?,
            session: None,
        },
        _ => return Err(OfferError::UnsupportedType(mime)),
    };
    check_sdp(&offer.sdp)?;
    Ok(offer)
}

/// An SDP is at most [`MAX_SDP_BYTES`], starts with `v=0`, has an `m=` line.
pub fn check_sdp(sdp: &str) -> Result<(), OfferError> {
    if sdp.len() > MAX_SDP_BYTES {
        return Err(OfferError::TooLarge);
    }
    let mut lines = sdp.lines().map(str::trim);
    if lines.next() != Some("v=0") || !lines.any(|l| l.starts_with("m=")) {
        return Err(OfferError::NotSdp);
    }
    Ok(())
}

fn parse_json(body: &[u8]) -> Result<Offer, OfferError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| OfferError::Json(e.to_string()))?;
    let Value::Object(mut o) = v else {
        return Err(OfferError::Json("the body must be a JSON object".into()));
    };
    let sdp = match o.remove("sdp") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(OfferError::NotSdp),
        None => return Err(OfferError::MissingSdp),
    };
    let session = match o.remove("session") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(OfferError::SessionNotObject),
    };
    Ok(Offer { sdp, session })
}

/// A `name=value` parameter of a header value (quotes removed).
fn param_of(header: &str, name: &str) -> Option<String> {
    header.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case(name)).then(|| v.trim().trim_matches('"').to_string())
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The parts of a `multipart/form-data` body: `sdp` (text) and `session`
/// (JSON object); other parts are ignored.
fn parse_multipart(body: &[u8], boundary: &str) -> Result<Offer, OfferError> {
    if boundary.is_empty() || boundary.len() > 200 {
        return Err(OfferError::Multipart("invalid boundary"));
    }
    let delim = format!("--{boundary}");
    let start = find(body, delim.as_bytes()).ok_or(OfferError::Multipart("boundary not found"))?;
    let mut rest = &body[start + delim.len()..];
    let sep = format!("\r\n--{boundary}");
    let (mut sdp, mut session) = (None, None);
    loop {
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or(OfferError::Multipart("expected CRLF after a boundary"))?;
        let head_end =
            find(rest, b"\r\n\r\n").ok_or(OfferError::Multipart("part without headers"))?;
        let head = std::str::from_utf8(&rest[..head_end])
            .map_err(|_| OfferError::Multipart("part headers are not UTF-8"))?;
        let content = &rest[head_end + 4..];
        let end =
            find(content, sep.as_bytes()).ok_or(OfferError::Multipart("unterminated part"))?;
        let data = &content[..end];
        rest = &content[end + sep.len()..];
        let name = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-disposition")
                .then(|| param_of(v, "name"))
                .flatten()
        });
        match name.as_deref() {
            Some("sdp") => {
                let s = String::from_utf8(data.to_vec()).map_err(|_| OfferError::NotSdp)?;
                sdp = Some(s);
            }
            Some("session") => {
                let v: Value = serde_json::from_slice(data)
                    .map_err(|e| OfferError::Json(format!("part 'session': {e}")))?;
                session = match v {
                    Value::Object(m) => Some(m),
                    Value::Null => None,
                    _ => return Err(OfferError::SessionNotObject),
                };
            }
            Some(_) => {}
            None => return Err(OfferError::Multipart("part without a name")),
        }
    }
    Ok(Offer {
        sdp: sdp.ok_or(OfferError::MissingSdp)?,
        session,
    })
}

/// A `multipart/form-data` body with `sdp` and, when given, `session`; the
/// returned string is the Content-Type to send with it.
pub fn encode_multipart(sdp: &str, session: Option<&Map<String, Value>>) -> (String, Vec<u8>) {
    let boundary = format!("patchbay-{}", crate::ids::short_id());
    let mut body = Vec::with_capacity(sdp.len() + 512);
    let mut part = |name: &str, ct: &str, data: &[u8]| {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\nContent-Type: {ct}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    };
    part("sdp", "application/sdp", sdp.as_bytes());
    if let Some(s) = session {
        part(
            "session",
            "application/json",
            Value::Object(s.clone()).to_string().as_bytes(),
        );
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub const SDP: &str = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n";

    #[test]
    fn raw_sdp_json_and_multipart_all_parse() {
        let raw = parse(Some("application/sdp"), SDP.as_bytes()).unwrap();
        assert_eq!(
            raw,
            Offer {
                sdp: SDP.into(),
                session: None
            }
        );
        let json = serde_json::json!({"sdp": SDP, "session": {"type": "realtime", "model": "m"}});
        let j = parse(Some("application/json"), json.to_string().as_bytes()).unwrap();
        assert_eq!(j.sdp, SDP);
        assert_eq!(j.session.unwrap()["model"], "m");
        let mut session = Map::new();
        session.insert("model".into(), "m".into());
        let (ct, body) = encode_multipart(SDP, Some(&session));
        let m = parse(Some(&ct), &body).unwrap();
        assert_eq!(
            m,
            Offer {
                sdp: SDP.into(),
                session: Some(session)
            }
        );
        let (ct, body) = encode_multipart(SDP, None);
        assert_eq!(parse(Some(&ct), &body).unwrap().session, None);
    }

    #[test]
    fn quoted_boundary_and_extra_parts_are_accepted() {
        let body = format!(
            "--xyz\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nhello\r\n--xyz\r\ncontent-disposition: form-data; name=\"sdp\"\r\n\r\n{SDP}\r\n--xyz--\r\n"
        );
        let o = parse(
            Some("multipart/form-data; boundary=\"xyz\""),
            body.as_bytes(),
        )
        .unwrap();
        assert_eq!(o.sdp, SDP);
    }

    #[test]
    fn each_bad_input_is_its_own_error() {
        let cases: Vec<(Option<&str>, Vec<u8>, OfferError)> = vec![
            (
                Some("text/html"),
                SDP.into(),
                OfferError::UnsupportedType("text/html".into()),
            ),
            (None, SDP.into(), OfferError::UnsupportedType(String::new())),
            (
                Some("multipart/form-data"),
                SDP.into(),
                OfferError::Multipart("no boundary"),
            ),
            (
                Some("multipart/form-data; boundary=b"),
                b"garbage".to_vec(),
                OfferError::Multipart("boundary not found"),
            ),
            (
                Some("multipart/form-data; boundary=b"),
                b"--b\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\nv=0".to_vec(),
                OfferError::Multipart("unterminated part"),
            ),
            (
                Some("multipart/form-data; boundary=b"),
                b"--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--".to_vec(),
                OfferError::MissingSdp,
            ),
            (
                Some("application/json"),
                b"{".to_vec(),
                OfferError::Json("EOF while parsing an object at line 1 column 1".into()),
            ),
            (
                Some("application/json"),
                b"{}".to_vec(),
                OfferError::MissingSdp,
            ),
            (
                Some("application/json"),
                format!("{{\"sdp\":{:?},\"session\":3}}", SDP).into_bytes(),
                OfferError::SessionNotObject,
            ),
            (
                Some("application/sdp"),
                b"hello".to_vec(),
                OfferError::NotSdp,
            ),
            (
                Some("application/sdp"),
                b"v=0\r\ns=-\r\n".to_vec(),
                OfferError::NotSdp,
            ),
        ];
        for (ct, body, want) in cases {
            assert_eq!(parse(ct, &body).unwrap_err(), want, "{ct:?}");
        }
    }

    #[test]
    fn an_sdp_over_64_kib_is_too_large() {
        let big = format!("{SDP}{}", "a=x\r\n".repeat(MAX_SDP_BYTES / 5));
        assert_eq!(
            parse(Some("application/sdp"), big.as_bytes()).unwrap_err(),
            OfferError::TooLarge
        );
        let mut at_limit = SDP.to_string();
        at_limit.push_str(&"x".repeat(MAX_SDP_BYTES - SDP.len()));
        assert!(check_sdp(&at_limit).is_ok());
    }
}
