//! PodDisruptionBudget `<name>-gateway`: voluntary disruptions take one gateway pod at a time.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{child_meta, gateway_name, selector_labels};
use crate::crd::RealtimeRoute;

pub fn pdb(route: &RealtimeRoute) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: child_meta(route, gateway_name(route)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(route)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn the_pdb_allows_one_pod_down_at_a_time() {
        let route = fixtures::route(fixtures::minimal_spec());
        let spec = pdb(&route).spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(spec.min_available, None);
        assert_eq!(
            spec.selector.unwrap().match_labels.unwrap(),
            selector_labels(&route)
        );
    }
}
