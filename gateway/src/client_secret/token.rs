//! The client-secret token: a self-contained, MAC-signed credential that any
//! replica holding the signing keys can verify without a shared store.
//!
//! Format: `pbek_` followed by the unpadded base64url encoding of
//! `payload ‖ tag`, where
//! - `payload` = version byte ([`VERSION`]) ‖ secret id (16 random bytes) ‖
//!   `expires_at` (Unix seconds, u64 big-endian) ‖ parent binding (16 bytes:
//!   HMAC-SHA256(signing key, [`PARENT_CONTEXT`] ‖ the parent key's
//!   `sha256`), truncated) ‖ parent key id (u8 length ‖ UTF-8) ‖ model (u8
//!   length ‖ UTF-8);
//! - `tag` = HMAC-SHA256(signing key, [`MAC_CONTEXT`] ‖ payload), 32 bytes.
//!
//! Guarantees:
//! - Every byte is covered by the tag: any change to the token (payload or
//!   tag) fails verification, and the tag is compared in constant time
//!   (`subtle`) against each verification key in turn, all of them scanned.
//! - Rotation: [`SigningKeys`] signs with its first key and verifies with
//!   all of them, so a new key can be put first while secrets signed by the
//!   old one stay valid until they expire.
//! - The token carries no upstream credential and no session config (which
//!   would be visible to the browser holding it); the config waits in the
//!   store under the secret id.
//!
//! - The parent binding ties a secret to the parent key's secret, not only
//!   its id: a key given a new secret under the same id (a rotation) no
//!   longer opens what the old one minted ([`SigningKeys::binds`]). It
//!   reveals nothing of the key's digest without the signing key.
//!
//! Caveats: the token is a bearer credential until `expires_at`; there is no
//! per-secret revocation other than disabling, removing or rotating the
//! parent key (checked at every connect) or removing the signing key. Time comes in as
//! a parameter, so expiry is tested without a clock.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::secret::Secret;

/// What every client secret starts with, so it is recognised (and never
/// looked up as a plain client key).
pub const TOKEN_PREFIX: &str = "pbek_";
/// Payload format version (2: with the parent binding).
pub const VERSION: u8 = 2;
/// Domain separation: a MAC made for anything else never verifies here.
pub const MAC_CONTEXT: &[u8] = b"patchbay client secret v2\0";
/// Domain separation of the parent binding.
pub const PARENT_CONTEXT: &[u8] = b"patchbay client secret parent\0";
/// Bytes of the parent binding.
pub const BIND_BYTES: usize = 16;
/// Shortest accepted signing key, in bytes (HMAC-SHA256's block-size
/// security needs at least the output size).
pub const MIN_SIGNING_KEY_BYTES: usize = 32;
/// Bytes of a randomly generated signing key.
pub const RANDOM_SIGNING_KEY_BYTES: usize = 32;
/// Bytes of randomness in a secret id.
pub const SECRET_ID_BYTES: usize = 16;
const TAG_BYTES: usize = 32;
/// Longest parent key id or model name a token can carry (one length byte).
pub const MAX_FIELD_BYTES: usize = 255;
/// Longest token accepted for decoding: prefix plus the largest payload.
const MAX_TOKEN_CHARS: usize = TOKEN_PREFIX.len()
    + 4 * (1 + SECRET_ID_BYTES + 8 + BIND_BYTES + 2 * (1 + MAX_FIELD_BYTES) + TAG_BYTES)
        .div_ceil(3);

type HmacSha256 = Hmac<Sha256>;

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `cs_` followed by 32 hex digits; the row field `client_secret_id`.
    pub id: String,
    /// The key that minted it: admission and metering use this key.
    pub parent_key_id: String,
    /// The route (client-facing model) it is bound to.
    pub model: String,
    /// Unix seconds; the secret opens no session at or after this.
    pub expires_at: u64,
    /// See [`SigningKeys::binds`].
    pub parent_bind: [u8; BIND_BYTES],
}

/// Why a presented client secret was refused; each is a 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("malformed client secret")]
    Malformed,
    #[error("client secret signature does not verify")]
    BadSignature,
    #[error("client secret expired")]
    Expired,
}

impl VerifyError {
    /// The `reason` label of `patchbay_client_secrets_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            VerifyError::Malformed => "malformed",
            VerifyError::BadSignature => "bad_signature",
            VerifyError::Expired => "expired",
        }
    }
}

/// Why a token could not be minted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MintError {
    #[error("{field} is longer than {MAX_FIELD_BYTES} bytes")]
    FieldTooLong { field: &'static str },
}

/// One signing key, ready to MAC. Never printed; equal when the key bytes
/// are (compared by digest).
#[derive(Clone)]
pub struct SigningKey {
    mac: HmacSha256,
    digest: [u8; 32],
}

impl SigningKey {
    /// A key from file contents: surrounding whitespace is trimmed, at least
    /// [`MIN_SIGNING_KEY_BYTES`] must remain.
    pub fn from_file_text(text: &str) -> Result<Self, String> {
        let bytes = text.trim().as_bytes();
        if bytes.len() < MIN_SIGNING_KEY_BYTES {
            return Err(format!(
                "a signing key must be at least {MIN_SIGNING_KEY_BYTES} bytes (got {})",
                bytes.len()
            ));
        }
        Self::from_bytes(bytes)
    }

    /// A fresh random key from the OS.
    pub fn random() -> Result<Self, String> {
        let mut k = [0u8; RANDOM_SIGNING_KEY_BYTES];
        getrandom::fill(&mut k).map_err(|e| format!("no OS randomness: {e}"))?;
        Self::from_bytes(&k)
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let mac = <HmacSha256 as Mac>::new_from_slice(bytes)
            .map_err(|_| "HMAC refused the key length".to_string())?;
        Ok(Self {
            mac,
            digest: crate::secret::sha256(bytes),
        })
    }

    /// HMAC-SHA256 of `context ‖ data` under this key.
    fn mac(&self, context: &[u8], data: &[u8]) -> [u8; TAG_BYTES] {
        let mut mac = self.mac.clone();
        mac.update(context);
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    fn tag(&self, payload: &[u8]) -> [u8; TAG_BYTES] {
        self.mac(MAC_CONTEXT, payload)
    }

    fn bind(&self, parent_sha256: &str) -> [u8; BIND_BYTES] {
        let full = self.mac(PARENT_CONTEXT, parent_sha256.as_bytes());
        let mut out = [0u8; BIND_BYTES];
        out.copy_from_slice(&full[..BIND_BYTES]);
        out
    }
}

impl PartialEq for SigningKey {
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.digest.ct_eq(&other.digest))
    }
}

impl Eq for SigningKey {}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey([REDACTED])")
    }
}

/// The signing key (first) and every verification key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKeys {
    keys: Vec<SigningKey>,
}

impl SigningKeys {
    /// `None` when `keys` is empty: there must be a key to sign with.
    pub fn new(keys: Vec<SigningKey>) -> Option<Self> {
        (!keys.is_empty()).then_some(Self { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A token for `id` (16 random bytes), signed with the first key.
    /// A token for the parent key `parent_key_id` whose digest is
    /// `parent_sha256` (its `sha256` in the key set).
    pub fn mint(
        &self,
        id: [u8; SECRET_ID_BYTES],
        parent_key_id: &str,
        parent_sha256: &str,
        model: &str,
        expires_at: u64,
    ) -> Result<Secret, MintError> {
        let field = |name: &'static str, v: &str| {
            u8::try_from(v.len()).map_err(|_| MintError::FieldTooLong { field: name })
        };
        let key_len = field("the parent key id", parent_key_id)?;
        let model_len = field("the model", model)?;
        let mut buf = Vec::with_capacity(
            1 + SECRET_ID_BYTES
                + 8
                + BIND_BYTES
                + 2
                + parent_key_id.len()
                + model.len()
                + TAG_BYTES,
        );
        buf.push(VERSION);
        buf.extend_from_slice(&id);
        buf.extend_from_slice(&expires_at.to_be_bytes());
        buf.extend_from_slice(&self.keys[0].bind(parent_sha256));
        buf.push(key_len);
        buf.extend_from_slice(parent_key_id.as_bytes());
        buf.push(model_len);
        buf.extend_from_slice(model.as_bytes());
        let tag = self.keys[0].tag(&buf);
        buf.extend_from_slice(&tag);
        Ok(Secret::new(format!(
            "{TOKEN_PREFIX}{}",
            URL_SAFE_NO_PAD.encode(&buf)
        )))
    }

    /// Checks the tag against every key, then the payload, then expiry
    /// against `now` (Unix seconds).
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, VerifyError> {
        let body = token
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(VerifyError::Malformed)?;
        if body.len() > MAX_TOKEN_CHARS {
            return Err(VerifyError::Malformed);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| VerifyError::Malformed)?;
        if raw.len() < 1 + SECRET_ID_BYTES + 8 + BIND_BYTES + 2 + TAG_BYTES {
            return Err(VerifyError::Malformed);
        }
        let (payload, tag) = raw.split_at(raw.len() - TAG_BYTES);
        let mut matched = subtle::Choice::from(0u8);
        for key in &self.keys {
            matched |= key.tag(payload).ct_eq(tag);
        }
        if !bool::from(matched) {
            return Err(VerifyError::BadSignature);
        }
        let claims = parse_payload(payload).ok_or(VerifyError::Malformed)?;
        if now >= claims.expires_at {
            return Err(VerifyError::Expired);
        }
        Ok(claims)
    }

    /// Whether verified `claims` were minted by the key whose digest is
    /// `parent_sha256` now (any signing key, compared in constant time):
    /// false once the parent's id carries another secret.
    pub fn binds(&self, claims: &Claims, parent_sha256: &str) -> bool {
        let mut matched = subtle::Choice::from(0u8);
        for key in &self.keys {
            matched |= key.bind(parent_sha256).ct_eq(&claims.parent_bind);
        }
        bool::from(matched)
    }
}

/// The fields of a signed payload; `None` when it does not parse exactly
/// (wrong version, short, trailing bytes, non-UTF-8).
fn parse_payload(p: &[u8]) -> Option<Claims> {
    let (&version, rest) = p.split_first()?;
    if version != VERSION {
        return None;
    }
    let (id, rest) = rest.split_at_checked(SECRET_ID_BYTES)?;
    let (exp, rest) = rest.split_at_checked(8)?;
    let expires_at = u64::from_be_bytes(exp.try_into().ok()?);
    let (bind, rest) = rest.split_at_checked(BIND_BYTES)?;
    let (key, rest) = length_prefixed(rest)?;
    let (model, rest) = length_prefixed(rest)?;
    if !rest.is_empty() || key.is_empty() || model.is_empty() {
        return None;
    }
    Some(Claims {
        id: secret_id_text(id),
        parent_key_id: key.to_string(),
        model: model.to_string(),
        expires_at,
        parent_bind: bind.try_into().ok()?,
    })
}

fn length_prefixed(p: &[u8]) -> Option<(&str, &[u8])> {
    let (&n, rest) = p.split_first()?;
    let (field, rest) = rest.split_at_checked(usize::from(n))?;
    Some((std::str::from_utf8(field).ok()?, rest))
}

/// `cs_` + hex of the id bytes.
pub fn secret_id_text(id: &[u8]) -> String {
    format!("cs_{}", hex::encode(id))
}

/// True when `presented` has the client-secret shape (it is then verified
/// as one, never looked up as a client key).
pub fn is_client_secret(presented: &str) -> bool {
    presented.starts_with(TOKEN_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;
    const PARENT_SHA: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

    fn key(c: char) -> SigningKey {
        SigningKey::from_file_text(&c.to_string().repeat(40)).unwrap()
    }

    fn keys(cs: &[char]) -> SigningKeys {
        SigningKeys::new(cs.iter().map(|c| key(*c)).collect()).unwrap()
    }

    fn mint(k: &SigningKeys) -> String {
        k.mint(
            [7; SECRET_ID_BYTES],
            "team-a-key",
            PARENT_SHA,
            "gpt-realtime",
            NOW + 600,
        )
        .unwrap()
        .expose()
        .to_string()
    }

    #[test]
    fn a_minted_token_verifies_with_its_claims() {
        let k = keys(&['a']);
        let t = mint(&k);
        assert!(t.starts_with(TOKEN_PREFIX));
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "a token must be usable as a WebSocket subprotocol token: {t}"
        );
        let c = k.verify(&t, NOW).unwrap();
        assert_eq!(
            c,
            Claims {
                id: format!("cs_{}", "07".repeat(SECRET_ID_BYTES)),
                parent_key_id: "team-a-key".into(),
                model: "gpt-realtime".into(),
                expires_at: NOW + 600,
                parent_bind: k.keys[0].bind(PARENT_SHA),
            }
        );
        assert!(k.binds(&c, PARENT_SHA));
        assert!(
            !k.binds(&c, &"0".repeat(64)),
            "another secret under the same id"
        );
    }

    #[test]
    fn expiry_is_exclusive_at_expires_at() {
        let k = keys(&['a']);
        let t = mint(&k);
        assert!(k.verify(&t, NOW + 599).is_ok());
        assert_eq!(k.verify(&t, NOW + 600), Err(VerifyError::Expired));
        assert_eq!(k.verify(&t, u64::MAX), Err(VerifyError::Expired));
    }

    #[test]
    fn every_single_byte_change_is_refused() {
        let k = keys(&['a']);
        let t = mint(&k);
        let raw = URL_SAFE_NO_PAD.decode(&t[TOKEN_PREFIX.len()..]).unwrap();
        for i in 0..raw.len() {
            for bit in 0..8 {
                let mut bad = raw.clone();
                bad[i] ^= 1 << bit;
                let bad = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(&bad));
                assert!(k.verify(&bad, NOW).is_err(), "byte {i} bit {bit} accepted");
            }
        }
        // And every character of the text form, replaced.
        for i in 0..t.len() {
            let mut chars: Vec<char> = t.chars().collect();
            chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
            let bad: String = chars.into_iter().collect();
            if bad != t {
                assert!(k.verify(&bad, NOW).is_err(), "char {i} accepted: {bad}");
            }
        }
    }

    #[test]
    fn truncated_extended_and_foreign_tokens_are_refused() {
        let k = keys(&['a']);
        let t = mint(&k);
        for n in 0..t.len() {
            assert!(
                k.verify(&t[..n], NOW).is_err(),
                "prefix of {n} chars accepted"
            );
        }
        assert!(k.verify(&format!("{t}A"), NOW).is_err());
        assert!(k.verify(&format!("{t}AAAA"), NOW).is_err());
        assert_eq!(
            k.verify(&t.replacen(TOKEN_PREFIX, "sk-", 1), NOW),
            Err(VerifyError::Malformed)
        );
        assert_eq!(k.verify("pbek_!!!", NOW), Err(VerifyError::Malformed));
        let huge = format!("{TOKEN_PREFIX}{}", "A".repeat(100_000));
        assert_eq!(k.verify(&huge, NOW), Err(VerifyError::Malformed));
    }

    #[test]
    fn another_key_refuses_and_rotation_keeps_old_secrets_valid() {
        let old = keys(&['a']);
        let t_old = mint(&old);
        assert_eq!(
            keys(&['b']).verify(&t_old, NOW),
            Err(VerifyError::BadSignature)
        );
        // Rotated: b signs, a still verifies.
        let rotated = keys(&['b', 'a']);
        assert!(rotated.verify(&t_old, NOW).is_ok());
        let t_new = mint(&rotated);
        assert!(rotated.verify(&t_new, NOW).is_ok());
        assert_eq!(old.verify(&t_new, NOW), Err(VerifyError::BadSignature));
        // a retired: its secrets stop working.
        assert_eq!(
            keys(&['b']).verify(&t_old, NOW),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn the_model_and_parent_are_bound_by_the_signature() {
        let k = keys(&['a']);
        let a = k
            .mint([1; SECRET_ID_BYTES], "k1", PARENT_SHA, "model-a", NOW + 60)
            .unwrap();
        let b = k
            .mint([1; SECRET_ID_BYTES], "k1", PARENT_SHA, "model-b", NOW + 60)
            .unwrap();
        assert_ne!(a, b);
        assert_eq!(k.verify(a.expose(), NOW).unwrap().model, "model-a");
        assert_eq!(k.verify(b.expose(), NOW).unwrap().model, "model-b");
    }

    #[test]
    fn oversized_fields_are_refused_at_mint() {
        let k = keys(&['a']);
        let long = "m".repeat(MAX_FIELD_BYTES + 1);
        assert!(matches!(
            k.mint([0; SECRET_ID_BYTES], "k", PARENT_SHA, &long, NOW),
            Err(MintError::FieldTooLong { .. })
        ));
        let max = "m".repeat(MAX_FIELD_BYTES);
        let t = k
            .mint([0; SECRET_ID_BYTES], &max, PARENT_SHA, &max, NOW + 1)
            .unwrap();
        assert_eq!(k.verify(t.expose(), NOW).unwrap().model, max);
    }

    #[test]
    fn short_signing_keys_are_refused_and_keys_never_print() {
        assert!(SigningKey::from_file_text("  short  \n").is_err());
        let k = SigningKey::from_file_text(&"x".repeat(32)).unwrap();
        assert!(!format!("{k:?}").contains("xxx"));
        assert!(!format!("{:?}", keys(&['q'])).contains("qqq"));
        let r1 = SigningKey::random().unwrap();
        let r2 = SigningKey::random().unwrap();
        assert_ne!(r1, r2);
    }
}
