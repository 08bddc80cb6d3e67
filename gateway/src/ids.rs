//! Identifiers for sessions and gateway events: 16 hex digits, unique per
//! process (a counter) and unlikely to collide across pods (mixed with a
//! per-process random seed from the OS through `RandomState`).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn seed() -> &'static RandomState {
    static SEED: OnceLock<RandomState> = OnceLock::new();
    SEED.get_or_init(RandomState::new)
}

/// A fresh 16-hex-digit id.
pub fn short_id() -> String {
    format!("{:016x}", random_u64())
}

/// A fresh number, spread evenly (not for secrets: the seed is per process).
pub fn random_u64() -> u64 {
    let mut h = seed().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_distinct_and_fixed_width() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| super::short_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|i| i.len() == 16));
    }
}
