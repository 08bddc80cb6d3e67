//! The upstream key of a route, swappable while the gateway runs.
//!
//! A route's key comes from an environment variable (`api_key_env`, fixed for the process's life)
//! or from a file (`api_key_file`, in Kubernetes a mounted Secret), which the gateway re-reads
//! when it changes ([`crate::watch`]). Every clone of an [`UpstreamKey`] shares one slot, so the
//! route config held by the pool and the dialler sees a replacement at once: the next dial (a
//! session's, or the pool's refill) sends the new key. Sockets already dialled keep the
//! session they opened with the old key; pooled ones are retired within `pool.max_idle_secs`
//! like every warm socket, and live sessions are never cut by a rotation.
//!
//! The key is never printed: `Debug` shows `[REDACTED]`, and only [`UpstreamKey::current`]
//! hands out the [`Secret`].

use std::fmt;
use std::sync::{Arc, RwLock};

use crate::secret::Secret;

/// A route's upstream key; clones share it.
#[derive(Clone, Default)]
pub struct UpstreamKey(Arc<RwLock<Secret>>);

impl UpstreamKey {
    pub fn new(key: Secret) -> Self {
        Self(Arc::new(RwLock::new(key)))
    }

    /// The key to send on the next dial.
    pub fn current(&self) -> Secret {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Swap in `key`; returns whether it differs from the current one.
    pub fn replace(&self, key: Secret) -> bool {
        let mut slot = self.0.write().unwrap_or_else(|e| e.into_inner());
        let changed = *slot != key;
        *slot = key;
        changed
    }
}

impl fmt::Debug for UpstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// The key in a key file's text: surrounding whitespace (a trailing newline) trimmed; `None`
/// when nothing is left.
pub fn key_from_file_text(text: &str) -> Option<Secret> {
    let key = text.trim();
    (!key.is_empty()).then(|| Secret::new(key))
}

/// Apply a changed key file of `model`'s route. An empty file, or a key that cannot be sent in a
/// header (a control character), is refused and keeps the current key.
pub fn apply_key_file(model: &str, key: &UpstreamKey, text: &str) -> Result<(), String> {
    let new = key_from_file_text(text).ok_or("the upstream key file is empty")?;
    if new.expose().chars().any(char::is_control) {
        return Err("the upstream key file holds a control character".into());
    }
    if key.replace(new) {
        tracing::info!(route = %model, "upstream key reloaded; new dials use it");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_key_and_see_a_replacement() {
        let key = UpstreamKey::new(Secret::new("sk-old"));
        let held_by_the_pool = key.clone();
        assert!(key.replace(Secret::new("sk-new")));
        assert_eq!(held_by_the_pool.current().expose(), "sk-new");
        assert!(!key.replace(Secret::new("sk-new")), "same key: no change");
    }

    #[test]
    fn the_key_is_never_printed() {
        let key = UpstreamKey::new(Secret::new("sk-very-secret"));
        assert_eq!(format!("{key:?}"), "[REDACTED]");
    }

    #[test]
    fn a_key_file_is_trimmed_and_an_empty_one_holds_no_key() {
        assert_eq!(key_from_file_text("sk-1\n").unwrap().expose(), "sk-1");
        assert!(key_from_file_text(" \n").is_none());
    }

    #[test]
    fn an_empty_or_unsendable_key_file_keeps_the_current_key() {
        let key = UpstreamKey::new(Secret::new("sk-1"));
        assert!(apply_key_file("m", &key, "\n").is_err());
        assert_eq!(key.current().expose(), "sk-1");
        assert!(apply_key_file("m", &key, "sk-2\u{7}\n").is_err());
        assert_eq!(key.current().expose(), "sk-1");
        apply_key_file("m", &key, "sk-2\n").unwrap();
        assert_eq!(key.current().expose(), "sk-2");
    }
}
