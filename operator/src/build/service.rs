//! Service `<name>`: `http` for clients, `metrics` for scrapers. When the route's pods end TLS
//! themselves (`spec.tls`), the client port says so with `appProtocol: https`, which is what
//! Gateway API implementations and meshes read to speak TLS to a backend.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{child_meta, selector_labels, service_name};
use crate::crd::RealtimeRoute;
use crate::gateway_config::{ADMIN_PORT, HTTP_PORT};

pub fn service(route: &RealtimeRoute) -> Service {
    Service {
        metadata: child_meta(route, service_name(route)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(route)),
            ports: Some(vec![
                ServicePort {
                    app_protocol: route.spec.tls.as_ref().map(|_| "https".into()),
                    ..port("http", HTTP_PORT)
                },
                port("metrics", ADMIN_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port: i32::from(port),
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn the_service_exposes_http_and_metrics_by_port_name() {
        let route = fixtures::route(fixtures::minimal_spec());
        let spec = service(&route).spec.unwrap();
        let ports: Vec<(String, i32, IntOrString)> = spec
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.port, p.target_port.unwrap()))
            .collect();
        assert_eq!(
            ports,
            [
                ("http".into(), 8080, IntOrString::String("http".into())),
                (
                    "metrics".into(),
                    9090,
                    IntOrString::String("metrics".into())
                ),
            ]
        );
        assert_eq!(
            spec.selector.unwrap(),
            crate::build::selector_labels(&route)
        );
    }

    #[test]
    fn the_client_port_is_marked_https_only_when_the_pods_end_tls() {
        let app_protocols = |spec| -> Vec<Option<String>> {
            let route = fixtures::route(spec);
            let ports = service(&route).spec.unwrap().ports.unwrap();
            ports.into_iter().map(|p| p.app_protocol).collect()
        };
        assert_eq!(app_protocols(fixtures::minimal_spec()), [None, None]);
        assert_eq!(
            app_protocols(fixtures::full_spec()),
            [Some("https".into()), None]
        );
    }
}
