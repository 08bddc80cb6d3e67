//! Applying a client secret's minted session config upstream, as OpenAI
//! applies it: right after `session.created`, the gateway sends the config
//! as a `session.update` and waits for the upstream's `session.updated`
//! before any client frame is relayed (the session holds client frames
//! meanwhile, as during a dial).
//!
//! Guarantees:
//! - The wait is bounded (the caller passes `server.upgrade_timeout_secs`).
//! - Upstream frames that arrive before the answer, and the
//!   `session.updated` itself, are returned in order for the client: the
//!   client sees the config it got, and nothing is dropped.
//! - An upstream `error` instead of `session.updated` ends the attempt
//!   with that frame, which the session forwards as received before
//!   closing 1011. A lost upstream or a timeout ends it too.
//!
//! The relay edits no client frame: after this step, the client may change
//! the session as it could with OpenAI.

use std::time::Duration;

use bytes::Bytes;

use crate::event::event_type;
use crate::relay::frame::FrameRole;
use crate::relay::leg::Control;
use crate::upstream::dial::UpstreamLeg;

/// Why the minted config could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The upstream answered with an `error` event (the frame, as received).
    #[error("the upstream refused the minted session config")]
    Refused { frame: String },
    #[error("no session.updated within {after:?}")]
    Timeout { after: Duration },
    #[error("the upstream closed or failed before session.updated")]
    UpstreamGone,
}

/// What an upstream text frame means while the config is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Applied,
    Refused,
    /// Anything else: keep it for the client and wait on.
    Other,
}

/// Classifies an upstream text frame by its event type.
pub fn classify(frame: &str) -> Answer {
    match event_type(frame).as_deref() {
        Some("session.updated") => Answer::Applied,
        Some("error") => Answer::Refused,
        _ => Answer::Other,
    }
}

/// What the upstream sent while the config was applied, `session.updated`
/// last.
#[derive(Debug, Default)]
pub struct Answered {
    /// Its frames as received, for the client.
    pub frames: Vec<Bytes>,
    /// Its text messages, for the tracker.
    pub texts: Vec<String>,
}

/// Sends `update` upstream and waits up to `timeout` for `session.updated`;
/// returns every upstream frame read, the `session.updated` last.
pub async fn apply(
    upstream: &mut UpstreamLeg,
    update: String,
    timeout: Duration,
) -> Result<Answered, ApplyError> {
    let work = async {
        upstream.queue_text(&update);
        upstream
            .flush()
            .await
            .map_err(|_| ApplyError::UpstreamGone)?;
        let mut answered = Answered::default();
        loop {
            let Ok(Some(f)) = upstream.next_frame().await else {
                return Err(ApplyError::UpstreamGone);
            };
            if f.role == FrameRole::Control {
                match upstream.answer(&f) {
                    Ok(Control::PingPong) => {
                        let _ = upstream.flush().await;
                        continue;
                    }
                    Ok(Control::Close(_)) | Err(_) => return Err(ApplyError::UpstreamGone),
                }
            }
            let text = upstream
                .text_of(&f)
                .map(|t| String::from_utf8_lossy(&t).into_owned());
            answered.frames.push(f.bytes);
            let Some(text) = text else {
                continue;
            };
            match classify(&text) {
                Answer::Applied => {
                    answered.texts.push(text);
                    return Ok(answered);
                }
                Answer::Refused => return Err(ApplyError::Refused { frame: text }),
                Answer::Other => answered.texts.push(text),
            }
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ApplyError::Timeout { after: timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_classified_by_event_type() {
        assert_eq!(
            classify(r#"{"type":"session.updated","event_id":"e","session":{}}"#),
            Answer::Applied
        );
        assert_eq!(
            classify(r#"{"type":"error","error":{"code":"invalid_value"}}"#),
            Answer::Refused
        );
        assert_eq!(
            classify(r#"{"type":"conversation.created"}"#),
            Answer::Other
        );
        assert_eq!(classify("not json"), Answer::Other);
        // The type is the event's, not a nested one.
        assert_eq!(
            classify(r#"{"type":"response.done","response":{"type":"error"}}"#),
            Answer::Other
        );
    }
}
