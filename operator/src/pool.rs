//! Per-pod warm pool sizing.
//!
//! A route declares its peak of concurrent session connects across all replicas; each pod keeps
//! `ceil(peakConcurrency / replicas)` upstream sockets warm, clamped to `[1, pool.maxSize]`, so the
//! fleet as a whole holds about one warm socket per expected concurrent connect. `pool.size` is an
//! explicit per-pod override (clamped to `[0, maxSize]`; 0 turns the pool off).
//!
//! Under an autoscaler the replica count is the Deployment's `spec.replicas` (the HPA's choice;
//! not `status.replicas`, which counts a rollout's surge pods), clamped to
//! `[replicas.min, replicas.max]`: before the HPA's first sync the Deployment holds the API
//! server's default of 1, and sizing for that would give every pod the whole peak. Before the
//! first observation it is `replicas.min`. The result is published through the `<name>-pool`
//! ConfigMap, never through the pod template, so a scale event resizes pools without a rollout.

use crate::crd::RealtimeRouteSpec;

/// The per-pod pool size for `replicas` gateway pods.
pub fn pool_size(spec: &RealtimeRouteSpec, replicas: i32) -> i32 {
    let max_size = spec.pool.max_size.max(1);
    if let Some(size) = spec.pool.size {
        return size.clamp(0, max_size);
    }
    let peak = i64::from(spec.peak_concurrency.max(0));
    let replicas = i64::from(replicas.max(1));
    let per_pod = (peak + replicas - 1) / replicas;
    // Clamped to an i32 bound, so the conversion cannot fail.
    i32::try_from(per_pod.clamp(1, i64::from(max_size))).unwrap_or(max_size)
}

/// The replica count the pool is sized for.
///
/// With a fixed count it is that count. Under an autoscaler it is the Deployment's desired
/// `spec.replicas` clamped to `[replicas.min, replicas.max]` (the HPA keeps it there; a count
/// outside is the API server's default before the HPA's first sync, or a scale the HPA is about
/// to undo), or `replicas.min` while there is none (no Deployment yet).
pub fn sizing_replicas(spec: &RealtimeRouteSpec, observed: Option<i32>) -> i32 {
    let (min, max) = (spec.replicas.min, spec.replicas.max());
    if spec.replicas.autoscaled() {
        observed.map_or(min, |r| r.clamp(min, max))
    } else {
        spec.replicas.min
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn spec(peak: i32, max_size: i32, size: Option<i32>) -> RealtimeRouteSpec {
        let mut spec = fixtures::minimal_spec();
        spec.peak_concurrency = peak;
        spec.pool.max_size = max_size;
        spec.pool.size = size;
        spec
    }

    #[test]
    fn pool_size_rounds_up_so_the_fleet_covers_the_peak() {
        assert_eq!(pool_size(&spec(500, 512, None), 10), 50);
        assert_eq!(pool_size(&spec(501, 512, None), 10), 51);
        assert_eq!(pool_size(&spec(7, 512, None), 2), 4);
        assert_eq!(pool_size(&spec(1, 512, None), 3), 1);
    }

    #[test]
    fn pool_size_is_at_least_one_warm_socket() {
        assert_eq!(pool_size(&spec(0, 512, None), 4), 1);
        assert_eq!(pool_size(&spec(0, 512, None), 0), 1);
    }

    #[test]
    fn pool_size_is_at_most_max_size() {
        assert_eq!(pool_size(&spec(10_000, 512, None), 2), 512);
        assert_eq!(pool_size(&spec(100, 8, None), 1), 8);
    }

    #[test]
    fn zero_replicas_are_sized_as_one() {
        assert_eq!(pool_size(&spec(40, 512, None), 0), 40);
    }

    #[test]
    fn the_override_wins_over_the_computed_size_and_is_clamped_to_max_size() {
        assert_eq!(pool_size(&spec(500, 512, Some(3)), 10), 3);
        assert_eq!(pool_size(&spec(500, 512, Some(0)), 10), 0);
        assert_eq!(pool_size(&spec(500, 16, Some(64)), 10), 16);
    }

    #[test]
    fn a_fixed_route_is_sized_for_its_fixed_count_whatever_is_observed() {
        let mut spec = fixtures::minimal_spec();
        spec.replicas.min = 3;
        spec.replicas.max = Some(3);
        assert_eq!(sizing_replicas(&spec, Some(7)), 3);
        assert_eq!(sizing_replicas(&spec, None), 3);
    }

    #[test]
    fn an_autoscaled_route_is_sized_for_the_observed_replicas_or_min_before_any() {
        let spec = fixtures::autoscaled_spec();
        assert_eq!(sizing_replicas(&spec, None), spec.replicas.min);
        assert_eq!(sizing_replicas(&spec, Some(0)), spec.replicas.min);
        assert_eq!(sizing_replicas(&spec, Some(7)), 7);
    }

    #[test]
    fn an_observed_count_outside_the_autoscaled_range_is_clamped_into_it() {
        // 2..10: a Deployment still at the API server's default of 1 (the HPA has not synced)
        // is sized as min, not as one pod carrying the whole peak.
        let spec = fixtures::autoscaled_spec();
        assert_eq!(sizing_replicas(&spec, Some(1)), 2);
        assert_eq!(pool_size(&spec, sizing_replicas(&spec, Some(1))), 250);
        assert_eq!(sizing_replicas(&spec, Some(2)), 2);
        assert_eq!(sizing_replicas(&spec, Some(10)), 10);
        assert_eq!(sizing_replicas(&spec, Some(25)), 10);
    }
}
