//! HorizontalPodAutoscaler `<name>-gateway` (autoscaling/v2), only when `replicas.max > min`.
//!
//! Scaling up is left to the HPA defaults (fast); scaling down is slow on purpose: a removed pod
//! drains live voice sessions, so the autoscaler removes at most one pod per
//! [`SCALE_DOWN_PERIOD_SECONDS`] after [`SCALE_DOWN_STABILIZATION_SECONDS`] of lower demand.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, PodsMetricSource, ResourceMetricSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::meta::{child_meta, gateway_name};
use crate::crd::{RealtimeRoute, DEFAULT_TARGET_CPU_UTILIZATION_PERCENT};

/// The gateway's per-pod gauge of live sessions, served by a custom-metrics adapter.
pub const SESSIONS_ACTIVE_METRIC: &str = "patchbay_realtime_sessions_active";
pub const SCALE_DOWN_STABILIZATION_SECONDS: i32 = 300;
pub const SCALE_DOWN_PERIOD_SECONDS: i32 = 120;

pub fn hpa(route: &RealtimeRoute) -> Option<HorizontalPodAutoscaler> {
    let spec = &route.spec;
    if !spec.replicas.autoscaled() {
        return None;
    }
    let targets = spec.autoscaling.clone().unwrap_or_default();
    let mut metrics = Vec::new();
    if let Some(sessions) = targets.target_active_sessions_per_pod {
        metrics.push(MetricSpec {
            type_: "Pods".into(),
            pods: Some(PodsMetricSource {
                metric: MetricIdentifier {
                    name: SESSIONS_ACTIVE_METRIC.into(),
                    selector: None,
                },
                target: MetricTarget {
                    type_: "AverageValue".into(),
                    average_value: Some(Quantity(sessions.to_string())),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        });
    }
    let cpu = match (
        targets.target_cpu_utilization_percentage,
        targets.target_active_sessions_per_pod,
    ) {
        (Some(cpu), _) => Some(cpu),
        (None, None) => Some(DEFAULT_TARGET_CPU_UTILIZATION_PERCENT),
        (None, Some(_)) => None,
    };
    if let Some(cpu) = cpu {
        metrics.push(MetricSpec {
            type_: "Resource".into(),
            resource: Some(ResourceMetricSource {
                name: "cpu".into(),
                target: MetricTarget {
                    type_: "Utilization".into(),
                    average_utilization: Some(cpu),
                    ..MetricTarget::default()
                },
            }),
            ..MetricSpec::default()
        });
    }
    Some(HorizontalPodAutoscaler {
        metadata: child_meta(route, gateway_name(route)),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: gateway_name(route),
            },
            min_replicas: Some(spec.replicas.min),
            max_replicas: spec.replicas.max(),
            metrics: Some(metrics),
            behavior: Some(HorizontalPodAutoscalerBehavior {
                scale_down: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(SCALE_DOWN_STABILIZATION_SECONDS),
                    select_policy: Some("Min".into()),
                    policies: Some(vec![HPAScalingPolicy {
                        type_: "Pods".into(),
                        value: 1,
                        period_seconds: SCALE_DOWN_PERIOD_SECONDS,
                    }]),
                    ..HPAScalingRules::default()
                }),
                scale_up: None,
            }),
        }),
        ..HorizontalPodAutoscaler::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Autoscaling;
    use crate::fixtures;

    #[test]
    fn no_hpa_when_min_equals_max() {
        let mut spec = fixtures::autoscaled_spec();
        spec.replicas.max = Some(spec.replicas.min);
        assert!(hpa(&fixtures::route(spec)).is_none());
        assert!(hpa(&fixtures::route(fixtures::minimal_spec())).is_none());
    }

    #[test]
    fn the_hpa_scales_the_gateway_deployment_between_min_and_max() {
        let route = fixtures::route(fixtures::autoscaled_spec());
        let spec = hpa(&route).unwrap().spec.unwrap();
        assert_eq!(spec.scale_target_ref.kind, "Deployment");
        assert_eq!(
            spec.scale_target_ref.name,
            format!("{}-gateway", fixtures::ROUTE_NAME)
        );
        assert_eq!(spec.min_replicas, Some(2));
        assert_eq!(spec.max_replicas, 10);
    }

    #[test]
    fn the_hpa_targets_active_sessions_and_cpu_when_both_are_given() {
        let route = fixtures::route(fixtures::autoscaled_spec());
        let metrics = hpa(&route).unwrap().spec.unwrap().metrics.unwrap();
        assert_eq!(metrics.len(), 2);
        let pods = metrics[0].pods.as_ref().unwrap();
        assert_eq!(metrics[0].type_, "Pods");
        assert_eq!(pods.metric.name, SESSIONS_ACTIVE_METRIC);
        assert_eq!(pods.target.type_, "AverageValue");
        assert_eq!(pods.target.average_value, Some(Quantity("40".into())));
        let cpu = metrics[1].resource.as_ref().unwrap();
        assert_eq!(cpu.name, "cpu");
        assert_eq!(cpu.target.average_utilization, Some(70));
    }

    #[test]
    fn the_hpa_uses_only_the_sessions_metric_when_only_it_is_given() {
        let mut spec = fixtures::autoscaled_spec();
        spec.autoscaling = Some(Autoscaling {
            target_active_sessions_per_pod: Some(25),
            target_cpu_utilization_percentage: None,
        });
        let metrics = hpa(&fixtures::route(spec))
            .unwrap()
            .spec
            .unwrap()
            .metrics
            .unwrap();
        assert_eq!(metrics.len(), 1);
        assert_eq!(metrics[0].type_, "Pods");
    }

    #[test]
    fn the_hpa_falls_back_to_cpu_when_no_target_is_given() {
        let mut spec = fixtures::autoscaled_spec();
        spec.autoscaling = None;
        let metrics = hpa(&fixtures::route(spec))
            .unwrap()
            .spec
            .unwrap()
            .metrics
            .unwrap();
        assert_eq!(metrics.len(), 1);
        assert_eq!(
            metrics[0]
                .resource
                .as_ref()
                .unwrap()
                .target
                .average_utilization,
            Some(DEFAULT_TARGET_CPU_UTILIZATION_PERCENT)
        );
    }

    #[test]
    fn the_hpa_scales_down_slowly() {
        let route = fixtures::route(fixtures::autoscaled_spec());
        let down = hpa(&route)
            .unwrap()
            .spec
            .unwrap()
            .behavior
            .unwrap()
            .scale_down
            .unwrap();
        assert_eq!(down.stabilization_window_seconds, Some(300));
        let policy = &down.policies.unwrap()[0];
        assert_eq!(
            (policy.type_.as_str(), policy.value, policy.period_seconds),
            ("Pods", 1, 120)
        );
    }
}
