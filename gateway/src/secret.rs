//! Secrets as a type.
//!
//! A [`Secret`] holds a key (client or upstream) in memory and refuses to show
//! it: `Debug` and `Display` print `[REDACTED]`, so a secret that ends up in a
//! log line, an error or a panic message is harmless. The only way to read it
//! is [`Secret::expose`], which is greppable.

use std::fmt;

use sha2::{Digest, Sha256};

/// A secret string. Never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The plaintext. Call sites are the places a secret leaves the process
    /// (an upstream header) or is hashed.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// SHA-256 of the secret: how client keys are stored and compared.
    pub fn sha256(&self) -> [u8; 32] {
        sha256(self.0.as_bytes())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_redacted_in_debug_and_display() {
        let s = Secret::new("sk-very-secret");
        assert_eq!(format!("{s:?}"), "[REDACTED]");
        assert_eq!(format!("{s}"), "[REDACTED]");
        assert_eq!(s.expose(), "sk-very-secret");
    }

    #[test]
    fn sha256_matches_the_known_vector() {
        assert_eq!(
            hex::encode(Secret::new("abc").sha256()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
