//! Gateway API exposure (`spec.expose`): the owned `HTTPRoute`, and what its parents say of it.
//!
//! After the other children are applied, [`sync`] checks that the cluster serves
//! `gateway.networking.k8s.io/v1` `httproutes` (API discovery), applies the route's `HTTPRoute`
//! (built by [`crate::build::http_route`]; its name was claimed with the other children, see
//! [`claim`]), and reads back what the Gateway controllers reported on it (`status.parents`) and
//! where each parent `Gateway` listens (`status.addresses` and its listeners), which become
//! `status.exposure` and the `Exposed` condition. A route that no longer asks for exposure has
//! its owned `HTTPRoute` deleted.
//!
//! Without the Gateway API CRDs nothing is applied and the outcome is
//! [`Exposure::Unavailable`] (`Degraded=True/GatewayAPIUnavailable`): every other child is already
//! reconciled, and the route keeps serving in-cluster. Gateway API objects are not watched (their
//! CRDs may be absent, and a watch on a missing resource would fail forever), so while a parent
//! has not accepted the route the reconcile comes back every
//! [`crate::controller::NOT_READY_RESYNC_INTERVAL`] to read its verdict.

use std::collections::BTreeSet;

use kube::api::{DeleteParams, DynamicObject, Patch};
use kube::{Api, ResourceExt};
use serde_json::Value;

use crate::apply::{apply_params, refused_as_invalid};
use crate::build::{
    gateway_resource, http_route_name, http_route_resource, GATEWAY_API_GROUP, GATEWAY_API_VERSION,
};
use crate::context::Context;
use crate::crd::{ExposureStatus, ParentRef, ParentStatus, RealtimeRoute};
use crate::error::{Error, Result};
use crate::ownership::{holder_of, Holder};

/// `Degraded` and `Exposed` reason when the cluster has no Gateway API.
pub const GATEWAY_API_UNAVAILABLE: &str = "GatewayAPIUnavailable";
/// The most URLs `status.exposure.urls` lists.
const MAX_URLS: usize = 16;

/// What [`sync`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// The route asks for none (and owns no `HTTPRoute` any more).
    NotAsked,
    /// The route asks for exposure, and the cluster does not serve the Gateway API.
    Unavailable(String),
    /// The `HTTPRoute` is applied; its parents' verdicts and URLs.
    Applied(ExposureStatus),
}

impl Exposure {
    /// Every parent accepted the route and resolved its references.
    pub fn accepted(&self) -> bool {
        match self {
            Exposure::Applied(status) => {
                !status.parents.is_empty()
                    && status
                        .parents
                        .iter()
                        .all(|p| p.accepted == "True" && p.resolved_refs == "True")
            }
            _ => false,
        }
    }
}

fn http_routes(ctx: &Context, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), namespace, &http_route_resource())
}

/// A 404, whether the API server says `NotFound` of an object or, for a resource it does not
/// serve at all, answers `404 page not found` in plain text (which the client cannot parse as a
/// `Status`, so only the code is there).
fn is_not_found(error: &Error) -> bool {
    matches!(error, Error::Api { source, .. } if matches!(&**source, kube::Error::Api(s) if s.code == 404))
}

/// Who holds the route's `HTTPRoute` name. A cluster without the Gateway API answers 404 like a
/// missing object: nobody (whether it may be applied is [`sync`]'s question).
pub async fn claim(ctx: &Context, route: &RealtimeRoute, namespace: &str) -> Result<Holder> {
    let name = http_route_name(route);
    match ctx
        .call(
            "get",
            "HTTPRoute",
            &name,
            http_routes(ctx, namespace).get_metadata_opt(&name),
        )
        .await
    {
        Ok(None) => Ok(Holder::Nobody),
        Ok(Some(meta)) => Ok(holder_of(meta.owner_references(), route.uid().as_deref())),
        Err(error) if is_not_found(&error) => Ok(Holder::Nobody),
        Err(error) => Err(error),
    }
}

/// Whether the API server serves `httproutes` in `gateway.networking.k8s.io/v1`; `Err` only for
/// a failure that is not an answer (a timeout, a 5xx).
async fn gateway_api_served(ctx: &Context) -> Result<bool> {
    let group_version = format!("{GATEWAY_API_GROUP}/{GATEWAY_API_VERSION}");
    match ctx
        .call(
            "discover",
            "APIGroup",
            &group_version,
            ctx.client.list_api_group_resources(&group_version),
        )
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "httproutes")),
        Err(error) if is_not_found(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Apply (or remove) the route's `HTTPRoute` and read what its parents say; see the module doc.
/// `desired` is the built `HTTPRoute`; `holder` what [`claim`] found.
pub async fn sync(
    ctx: &Context,
    route: &RealtimeRoute,
    namespace: &str,
    desired: Option<&DynamicObject>,
    holder: Holder,
) -> Result<Exposure> {
    let api = http_routes(ctx, namespace);
    let name = http_route_name(route);
    let Some(desired) = desired else {
        if holder == Holder::Route {
            match ctx
                .call(
                    "delete",
                    "HTTPRoute",
                    &name,
                    api.delete(&name, &DeleteParams::background()),
                )
                .await
            {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(error),
            }
        }
        return Ok(Exposure::NotAsked);
    };
    if !gateway_api_served(ctx).await? {
        return Ok(Exposure::Unavailable(format!(
            "spec.expose needs the Gateway API: this cluster serves no {GATEWAY_API_GROUP}/{GATEWAY_API_VERSION} \
             httproutes (install its standard-channel CRDs); the route serves in-cluster meanwhile"
        )));
    }
    let applied = ctx
        .call(
            "apply",
            "HTTPRoute",
            &name,
            api.patch(&name, &apply_params(), &Patch::Apply(desired)),
        )
        .await
        .map_err(refused_as_invalid)?;
    // `desired` is built from `spec.expose`; without it there is nothing to report on.
    let Some(expose) = route.spec.expose.as_ref() else {
        return Ok(Exposure::NotAsked);
    };
    let mut status = ExposureStatus {
        http_route: name,
        parents: parent_statuses(namespace, &expose.parent_refs, &applied.data),
        urls: Vec::new(),
    };
    let gateways: Vec<(ParentRef, Option<Value>)> = {
        let mut found = Vec::new();
        for parent in expose.parent_refs.iter().filter(|p| is_gateway(p)) {
            let ns = parent.namespace.as_deref().unwrap_or(namespace);
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), ns, &gateway_resource());
            // A Gateway that cannot be read gives no URL; its verdict is in `parents` anyway.
            let gateway = match ctx
                .call("get", "Gateway", &parent.name, api.get_opt(&parent.name))
                .await
            {
                Ok(gateway) => gateway.map(|g| g.data),
                Err(error) => {
                    tracing::debug!(gateway = %parent.name, %error, "cannot read the parent Gateway");
                    None
                }
            };
            found.push((parent.clone(), gateway));
        }
        found
    };
    status.urls = urls(route, &gateways);
    Ok(Exposure::Applied(status))
}

fn is_gateway(p: &ParentRef) -> bool {
    p.group.as_deref().unwrap_or(GATEWAY_API_GROUP) == GATEWAY_API_GROUP
        && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
}

/// `namespace/name[/section]` of a parent reference.
fn parent_label(namespace: &str, p: &ParentRef) -> String {
    let ns = p.namespace.as_deref().unwrap_or(namespace);
    match &p.section_name {
        Some(section) => format!("{ns}/{}/{section}", p.name),
        None => format!("{ns}/{}", p.name),
    }
}

/// Each parent the route names, with the `Accepted` and `ResolvedRefs` conditions its Gateway
/// controller reported in `HTTPRoute.status.parents` (pure). A parent nobody reported on yet is
/// `Unknown/Pending`.
pub fn parent_statuses(namespace: &str, wanted: &[ParentRef], route: &Value) -> Vec<ParentStatus> {
    let reported = route["status"]["parents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    wanted
        .iter()
        .map(|p| {
            let entry = reported.iter().find(|r| {
                let r = &r["parentRef"];
                r["name"].as_str() == Some(p.name.as_str())
                    && r["namespace"].as_str().unwrap_or(namespace)
                        == p.namespace.as_deref().unwrap_or(namespace)
                    && r["sectionName"].as_str() == p.section_name.as_deref()
            });
            let condition = |type_: &str| {
                entry
                    .and_then(|e| e["conditions"].as_array())
                    .and_then(|cs| cs.iter().find(|c| c["type"].as_str() == Some(type_)))
            };
            let state = |c: Option<&Value>| {
                c.and_then(|c| c["status"].as_str())
                    .unwrap_or("Unknown")
                    .to_string()
            };
            let (accepted, resolved) = (condition("Accepted"), condition("ResolvedRefs"));
            let mut status = ParentStatus {
                parent: parent_label(namespace, p),
                accepted: state(accepted),
                resolved_refs: state(resolved),
                ..ParentStatus::default()
            };
            if entry.is_none() {
                status.reason = "Pending".into();
                status.message = "no Gateway controller has reported on this parent yet".into();
            } else if let Some(bad) = [accepted, resolved]
                .into_iter()
                .flatten()
                .find(|c| c["status"].as_str() != Some("True"))
            {
                status.reason = bad["reason"].as_str().unwrap_or_default().to_string();
                status.message = bad["message"].as_str().unwrap_or_default().to_string();
            }
            status
        })
        .collect()
}

/// The URLs clients reach the route at through its parent Gateways (pure): per listener the
/// reference selects (by `sectionName` and `port`; HTTP and HTTPS ones only), the route's own
/// host names, else the listener's, else the Gateway's `status.addresses`; `wss` on an HTTPS
/// listener, `ws` on HTTP; the default port left out; the path prefix and the endpoint's path
/// after.
pub fn urls(route: &RealtimeRoute, gateways: &[(ParentRef, Option<Value>)]) -> Vec<String> {
    let Some(expose) = &route.spec.expose else {
        return Vec::new();
    };
    let path = format!(
        "{}{}",
        expose.path_prefix.as_deref().unwrap_or(""),
        route.spec.endpoint.openai_path()
    );
    let mut out = BTreeSet::new();
    for (parent, gateway) in gateways {
        let Some(gateway) = gateway else { continue };
        let addresses: Vec<&str> = gateway["status"]["addresses"]
            .as_array()
            .map(|a| a.iter().filter_map(|a| a["value"].as_str()).collect())
            .unwrap_or_default();
        let listeners = gateway["spec"]["listeners"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for listener in &listeners {
            let selected = parent
                .section_name
                .as_deref()
                .is_none_or(|s| listener["name"].as_str() == Some(s))
                && parent
                    .port
                    .is_none_or(|p| listener["port"].as_i64() == Some(i64::from(p)));
            let (scheme, default_port) = match listener["protocol"].as_str() {
                Some("HTTPS") => ("wss", 443),
                Some("HTTP") => ("ws", 80),
                _ => continue,
            };
            if !selected {
                continue;
            }
            let port = listener["port"].as_i64().unwrap_or(default_port);
            let port = if port == default_port {
                String::new()
            } else {
                format!(":{port}")
            };
            let own: Vec<&str> = expose
                .hostnames
                .iter()
                .map(String::as_str)
                .filter(|h| !h.starts_with('*'))
                .collect();
            let hosts = if !own.is_empty() {
                own
            } else if let Some(h) = listener["hostname"]
                .as_str()
                .filter(|h| !h.starts_with('*'))
            {
                vec![h]
            } else {
                addresses.clone()
            };
            for host in hosts {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.to_string()
                };
                out.insert(format!("{scheme}://{host}{port}{path}"));
            }
        }
    }
    out.into_iter().take(MAX_URLS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Expose;
    use crate::fixtures;
    use serde_json::json;

    fn route(expose: Expose) -> RealtimeRoute {
        let mut spec = fixtures::minimal_spec();
        spec.expose = Some(expose);
        fixtures::route(spec)
    }

    fn parent(name: &str, section: Option<&str>) -> ParentRef {
        ParentRef {
            name: name.into(),
            section_name: section.map(String::from),
            ..ParentRef::default()
        }
    }

    fn expose(parents: Vec<ParentRef>) -> Expose {
        Expose {
            parent_refs: parents,
            hostnames: vec![],
            path_prefix: None,
            timeout_seconds: 3600,
        }
    }

    fn gateway() -> Value {
        json!({
            "spec": {"listeners": [
                {"name": "web", "port": 80, "protocol": "HTTP"},
                {"name": "https", "port": 8443, "protocol": "HTTPS", "hostname": "voice.example.com"},
                {"name": "tcp", "port": 9000, "protocol": "TCP"},
            ]},
            "status": {"addresses": [{"type": "IPAddress", "value": "203.0.113.7"}]},
        })
    }

    #[test]
    fn urls_come_from_the_listeners_the_reference_selects() {
        let all = parent("public", None);
        let r = route(expose(vec![all.clone()]));
        assert_eq!(
            urls(&r, &[(all, Some(gateway()))]),
            vec![
                "ws://203.0.113.7/v1/realtime".to_string(),
                "wss://voice.example.com:8443/v1/realtime".to_string(),
            ]
        );
        let https = parent("public", Some("https"));
        let mut e = expose(vec![https.clone()]);
        e.path_prefix = Some("/voice".into());
        e.hostnames = vec!["*.example.com".into(), "rt.example.com".into()];
        assert_eq!(
            urls(&route(e), &[(https, Some(gateway()))]),
            vec!["wss://rt.example.com:8443/voice/v1/realtime".to_string()]
        );
        // A Gateway not found or without addresses yet gives nothing to guess from.
        let r = route(expose(vec![parent("public", Some("web"))]));
        assert!(urls(&r, &[(parent("public", Some("web")), None)]).is_empty());
        let mut bare = gateway();
        bare["status"] = json!({});
        assert!(urls(&r, &[(parent("public", Some("web")), Some(bare))]).is_empty());
    }

    #[test]
    fn each_parent_shows_its_controllers_verdict_or_pending() {
        let wanted = vec![
            parent("public", Some("https")),
            ParentRef {
                namespace: Some("edge".into()),
                ..parent("internal", None)
            },
            parent("late", None),
        ];
        let http_route = json!({"status": {"parents": [
            {"parentRef": {"name": "public", "sectionName": "https"}, "controllerName": "x",
             "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted"},
                {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs"}]},
            {"parentRef": {"name": "internal", "namespace": "edge"}, "controllerName": "x",
             "conditions": [
                {"type": "Accepted", "status": "False", "reason": "NotAllowedByListeners",
                 "message": "no listener allows routes from realtime"},
                {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs"}]},
        ]}});
        let got = parent_statuses("realtime", &wanted, &http_route);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].parent, "realtime/public/https");
        assert_eq!(
            (got[0].accepted.as_str(), got[0].resolved_refs.as_str()),
            ("True", "True")
        );
        assert_eq!(got[0].reason, "");
        assert_eq!(got[1].parent, "edge/internal");
        assert_eq!(got[1].accepted, "False");
        assert_eq!(got[1].reason, "NotAllowedByListeners");
        assert_eq!(got[1].message, "no listener allows routes from realtime");
        assert_eq!(
            (got[2].accepted.as_str(), got[2].reason.as_str()),
            ("Unknown", "Pending")
        );
        let ok = Exposure::Applied(ExposureStatus {
            parents: got[..1].to_vec(),
            ..ExposureStatus::default()
        });
        assert!(ok.accepted());
        let not_yet = Exposure::Applied(ExposureStatus {
            parents: got.clone(),
            ..ExposureStatus::default()
        });
        assert!(!not_yet.accepted());
        assert!(!Exposure::Unavailable(String::new()).accepted());
    }
}
