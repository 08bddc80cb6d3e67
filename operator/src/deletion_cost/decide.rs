//! Which gateway pods get a new `controller.kubernetes.io/pod-deletion-cost`, and in what order
//! (pure; the I/O is in [`super::keeper`]).
//!
//! The ReplicaSet controller deletes pods with the lowest cost first when it scales down, so the
//! cost of each ready gateway pod should be its number of live sessions. Patching on every change
//! would cost one API write per session start or end per pod, so a pod is patched only when
//!
//! - it has never been given a cost it can be compared with (an unparsable value), or
//! - its session count reaches or leaves 0 (an idle pod must always look idle, a busy pod never
//!   idle: that distinction is what saves live calls), or
//! - the count moved by more than [`HYSTERESIS_SESSIONS`] from the value the pod carries.
//!
//! A pod without the annotation counts as cost 0, as it does for the ReplicaSet controller.
//! Pods that are not ready, have no IP yet or are already being deleted are left alone. Each
//! round patches at most a budget of pods, the transitions through 0 first, then the largest
//! moves; the rest wait for the next round.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// The annotation the ReplicaSet controller orders scale-down victims by (a route's
/// `gateway.podAnnotations` cannot set it).
pub const COST_ANNOTATION: &str = crate::crd::POD_DELETION_COST_ANNOTATION;
/// A cost is rewritten when the live count moved by more than this many sessions.
pub const HYSTERESIS_SESSIONS: i64 = 2;

/// A pod whose cost the operator keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub namespace: String,
    /// The route it serves (`app.kubernetes.io/instance`).
    pub route: String,
    pub ip: IpAddr,
    /// The cost the pod carries: `Some(0)` without the annotation, `None` when unparsable.
    pub cost: Option<i64>,
}

/// One patch to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostPatch {
    pub name: String,
    pub namespace: String,
    pub cost: i64,
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The pods whose cost is kept: ready, with a pod IP, not being deleted.
pub fn candidates(pods: &[Pod]) -> Vec<Candidate> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
            let cost = match p.annotations().get(COST_ANNOTATION) {
                None => Some(0),
                Some(v) => v.trim().parse().ok(),
            };
            Some(Candidate {
                name: p.name_any(),
                namespace: p.namespace().unwrap_or_default(),
                route: p
                    .labels()
                    .get("app.kubernetes.io/instance")
                    .cloned()
                    .unwrap_or_default(),
                ip,
                cost,
            })
        })
        .collect()
}

/// Whether a pod carrying `current` should be patched to `sessions`.
pub fn needs_patch(current: Option<i64>, sessions: i64) -> bool {
    match current {
        None => true,
        Some(current) => {
            (current == 0) != (sessions == 0) || (current - sessions).abs() > HYSTERESIS_SESSIONS
        }
    }
}

/// The patches of one round, at most `budget`: every candidate with a scraped session count
/// (`None`: the scrape failed, the pod is skipped) that [`needs_patch`], transitions through 0
/// first, then by how far the cost is off, largest first.
pub fn plan(scraped: &[(Candidate, Option<i64>)], budget: usize) -> Vec<CostPatch> {
    let mut wanted: Vec<(bool, i64, CostPatch)> = scraped
        .iter()
        .filter_map(|(pod, sessions)| {
            let sessions = (*sessions)?.max(0);
            needs_patch(pod.cost, sessions).then(|| {
                let through_zero = pod.cost.is_none_or(|c| (c == 0) != (sessions == 0));
                let off_by = pod.cost.map_or(i64::MAX, |c| (c - sessions).abs());
                (
                    through_zero,
                    off_by,
                    CostPatch {
                        name: pod.name.clone(),
                        namespace: pod.namespace.clone(),
                        cost: sessions,
                    },
                )
            })
        })
        .collect();
    wanted.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then(a.2.name.cmp(&b.2.name))
    });
    wanted.into_iter().take(budget).map(|(_, _, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ready: bool, ip: Option<&str>, cost: Option<&str>) -> Pod {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "realtime"},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap();
        if let Some(ip) = ip {
            pod.status.as_mut().unwrap().pod_ip = Some(ip.into());
        }
        if let Some(cost) = cost {
            pod.annotations_mut()
                .insert(COST_ANNOTATION.into(), cost.into());
        }
        pod
    }

    fn candidate(name: &str, cost: Option<i64>) -> Candidate {
        Candidate {
            name: name.into(),
            namespace: "realtime".into(),
            route: "voice".into(),
            ip: "127.0.0.2".parse().unwrap(),
            cost,
        }
    }

    #[test]
    fn only_ready_pods_with_an_ip_that_are_not_being_deleted_are_candidates() {
        let mut deleting = pod("d", true, Some("10.0.0.4"), None);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let pods = [
            pod("a", true, Some("10.0.0.1"), Some("7")),
            pod("b", false, Some("10.0.0.2"), None),
            pod("c", true, None, None),
            deleting,
            pod("e", true, Some("10.0.0.5"), None),
            pod("f", true, Some("10.0.0.6"), Some("lots")),
            pod("g", true, Some("not-an-ip"), None),
        ];
        let found: Vec<(String, Option<i64>)> = candidates(&pods)
            .into_iter()
            .map(|c| (c.name, c.cost))
            .collect();
        assert_eq!(
            found,
            [
                ("a".to_string(), Some(7)),
                ("e".to_string(), Some(0)),
                ("f".to_string(), None)
            ]
        );
        assert_eq!(candidates(&pods)[0].ip.to_string(), "10.0.0.1");
    }

    #[test]
    fn reaching_or_leaving_zero_is_always_patched() {
        assert!(needs_patch(Some(0), 1));
        assert!(needs_patch(Some(1), 0));
        assert!(needs_patch(Some(100), 0));
        assert!(!needs_patch(Some(0), 0));
    }

    #[test]
    fn small_moves_between_busy_counts_wait_for_the_hysteresis() {
        for (current, sessions, patch) in [
            (10, 10, false),
            (10, 11, false),
            (10, 12, false),
            (10, 8, false),
            (10, 13, true),
            (10, 7, true),
            (1, 3, false),
            (1, 4, true),
        ] {
            assert_eq!(
                needs_patch(Some(current), sessions),
                patch,
                "{current} -> {sessions}"
            );
        }
        assert_eq!(HYSTERESIS_SESSIONS, 2);
    }

    #[test]
    fn an_unparsable_cost_is_always_rewritten() {
        assert!(needs_patch(None, 0));
        assert!(needs_patch(None, 5));
    }

    #[test]
    fn a_round_patches_zero_transitions_first_then_the_largest_moves_within_its_budget() {
        let scraped = [
            (candidate("small", Some(10)), Some(14)),  // off by 4
            (candidate("steady", Some(10)), Some(11)), // within hysteresis
            (candidate("idle-now", Some(3)), Some(0)), // leaves busy for 0
            (candidate("big", Some(50)), Some(10)),    // off by 40
            (candidate("unscraped", Some(0)), None),   // scrape failed: skipped
            (candidate("busy-now", Some(0)), Some(1)), // leaves 0
            (candidate("garbled", None), Some(2)),     // unparsable
        ];
        let names = |budget| {
            plan(&scraped, budget)
                .into_iter()
                .map(|p| (p.name, p.cost))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(10),
            [
                ("garbled".to_string(), 2),
                ("idle-now".to_string(), 0),
                ("busy-now".to_string(), 1),
                ("big".to_string(), 10),
                ("small".to_string(), 14),
            ]
        );
        assert_eq!(names(3).len(), 3);
        assert_eq!(names(3)[2].0, "busy-now");
        assert!(names(0).is_empty());
    }

    #[test]
    fn a_negative_scrape_is_clamped_to_zero() {
        let plan = plan(&[(candidate("p", Some(4)), Some(-3))], 5);
        assert_eq!(plan[0].cost, 0);
    }
}
