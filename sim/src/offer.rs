//! The body of a create-call request as OpenAI reads it: the SDP offer as
//! the whole body (`application/sdp`), or `multipart/form-data` with a part
//! `sdp` and an optional part `session` (a JSON object), as openai-python's
//! `resources/realtime/calls.py` (`create`) sends it; and the answer the
//! simulator makes of an offer ([`answer_for`]).

use serde_json::{Map, Value};
use sha2::Digest;

/// The largest body read.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// An offer as received.
#[derive(Debug)]
pub struct Offer {
    pub sdp: String,
    pub session: Option<Map<String, Value>>,
}

/// Reads a body by its `Content-Type`; the error is the message of the 400.
pub fn parse(content_type: Option<&str>, body: &[u8]) -> Result<Offer, String> {
    let ct = content_type.unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let offer = match mime.as_str() {
        "application/sdp" => Offer {
            sdp: String::from_utf8(body.to_vec()).map_err(|_| "the SDP is not UTF-8")?,
            session: None,
        },
        "multipart/form-data" => {
            let boundary = ct
                .split(';')
                .find_map(|p| p.trim().strip_prefix("boundary="))
                .map(|b| b.trim_matches('"'))
                .ok_or("multipart body without a boundary")?;
            multipart(body, boundary)?
        }
        other => return Err(format!("unsupported Content-Type '{other}'")),
    };
    let mut lines = offer.sdp.lines().map(str::trim);
    if lines.next() != Some("v=0") || !lines.any(|l| l.starts_with("m=")) {
        return Err("Invalid SDP offer".into());
    }
    Ok(offer)
}

fn multipart(body: &[u8], boundary: &str) -> Result<Offer, String> {
    let body = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8")?;
    let (mut sdp, mut session) = (None, None);
    for part in body.split(&format!("--{boundary}")).skip(1) {
        if part.starts_with("--") {
            break;
        }
        let (head, data) = part
            .trim_start_matches("\r\n")
            .split_once("\r\n\r\n")
            .ok_or("a part without headers")?;
        let data = data.strip_suffix("\r\n").unwrap_or(data);
        let name = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .and_then(|l| l.split(';').find_map(|p| p.trim().strip_prefix("name=")))
            .map(|n| n.trim_matches('"'));
        match name {
            Some("sdp") => sdp = Some(data.to_string()),
            Some("session") => match serde_json::from_str(data) {
                Ok(Value::Object(m)) => session = Some(m),
                _ => return Err("'session' must be a JSON object".into()),
            },
            _ => {}
        }
    }
    Ok(Offer {
        sdp: sdp.ok_or("Missing required parameter: 'sdp'.")?,
        session,
    })
}

/// An SDP answer for `offer`: per media section the offer's `m=` line, its
/// `a=mid`, its codec lines (`a=rtpmap`, `a=fmtp`, `a=rtcp-fb`,
/// `a=extmap`), `a=setup:active`, ICE credentials and a host candidate, one
/// fingerprint for the session, and a `BUNDLE` group of the mids.
pub fn answer_for(offer: &str, call_id: &str) -> String {
    let digest = sha2::Sha256::digest(call_id.as_bytes());
    let fingerprint: Vec<String> = digest.iter().map(|b| format!("{b:02X}")).collect();
    let ufrag = &hex::encode(&digest[..4]);
    let pwd = &hex::encode(&digest[4..16]);
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in offer.lines().map(str::trim_end) {
        if line.starts_with("m=") {
            sections.push((line.to_string(), Vec::new()));
        } else if let Some((_, attrs)) = sections.last_mut() {
            let keep = [
                "a=mid:",
                "a=rtpmap:",
                "a=fmtp:",
                "a=rtcp-fb:",
                "a=extmap:",
                "a=sctp-port:",
            ];
            if keep.iter().any(|k| line.starts_with(k)) || line == "a=rtcp-mux" {
                attrs.push(line.to_string());
            }
        }
    }
    let mids: Vec<&str> = sections
        .iter()
        .flat_map(|(_, a)| a.iter().filter_map(|l| l.strip_prefix("a=mid:")))
        .collect();
    let mut out = vec![
        "v=0".to_string(),
        format!(
            "o=- {} 2 IN IP4 127.0.0.1",
            u64::from_be_bytes([digest[0], digest[1], digest[2], digest[3], 0, 0, 0, 1])
        ),
        "s=-".into(),
        "t=0 0".into(),
    ];
    if !mids.is_empty() {
        out.push(format!("a=group:BUNDLE {}", mids.join(" ")));
    }
    out.push("a=msid-semantic: WMS *".into());
    out.push(format!("a=fingerprint:sha-256 {}", fingerprint.join(":")));
    for (m, attrs) in &sections {
        out.push(m.clone());
        out.push("c=IN IP4 127.0.0.1".into());
        out.push(format!("a=ice-ufrag:{ufrag}"));
        out.push(format!("a=ice-pwd:{pwd}"));
        out.push("a=setup:active".into());
        if m.starts_with("m=audio") {
            out.push("a=sendrecv".into());
        }
        out.extend(attrs.iter().cloned());
        out.push("a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host".into());
    }
    let mut s = out.join("\r\n");
    s.push_str("\r\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const SDP: &str =
        "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n";

    #[test]
    fn a_raw_sdp_and_a_multipart_offer_are_read() {
        assert_eq!(
            parse(Some("application/sdp"), SDP.as_bytes()).unwrap().sdp,
            SDP
        );
        let body = format!(
            "--b\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\n{SDP}\r\n--b\r\nContent-Disposition: form-data; name=\"session\"\r\nContent-Type: application/json\r\n\r\n{{\"type\":\"realtime\"}}\r\n--b--\r\n"
        );
        let offer = parse(Some("multipart/form-data; boundary=b"), body.as_bytes()).unwrap();
        assert_eq!(offer.sdp, SDP);
        assert_eq!(offer.session.unwrap()["type"], "realtime");
    }

    #[test]
    fn what_is_not_an_offer_is_refused() {
        assert!(parse(Some("application/sdp"), b"hello").is_err());
        assert!(parse(Some("text/html"), SDP.as_bytes()).is_err());
        assert!(parse(Some("multipart/form-data; boundary=b"), b"--b--\r\n").is_err());
    }
}
