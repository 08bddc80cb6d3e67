//! Gateway API exposure (`spec.expose`) against a real API server: without the Gateway API CRDs
//! the route is `Degraded=GatewayAPIUnavailable` and everything else reconciles; with the
//! standard-channel CRDs (from `PATCHBAY_E2E_GATEWAY_API_CRDS`, a directory of their manifests)
//! the owned `HTTPRoute` appears with the parents, rules and owner reference, a parent's verdict
//! and its Gateway's address reach the route's status, a foreign `HTTPRoute` of the route's name
//! is refused, and dropping `spec.expose` deletes the owned one.
//!
//! The test installs and removes the Gateway API CRDs cluster-wide: a throwaway cluster only.
//! The test itself plays the Gateway controller (it writes the `HTTPRoute`'s and the
//! `Gateway`'s status), as no implementation runs here.

use super::*;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

const CRDS_ENV: &str = "PATCHBAY_E2E_GATEWAY_API_CRDS";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", kind),
        plural,
    )
}

fn gateway_api_crds() -> Vec<CustomResourceDefinition> {
    let Ok(dir) = std::env::var(CRDS_ENV) else {
        panic!(
            "{CRDS_ENV} is not set: the Gateway API test needs the standard-channel CRDs of a \
             kubernetes-sigs/gateway-api release (its config/crd/standard/ directory), e.g. \
             {CRDS_ENV}=/tmp/gwapi (see docs/operator.md); run the others with `--skip gateway_api`"
        )
    };
    let mut crds = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the Gateway API CRD directory") {
        let path = entry.expect("entry").path();
        for doc in yaml_docs(&path) {
            if doc["kind"].as_str() == Some("CustomResourceDefinition") {
                crds.push(serde_yaml::from_value(doc).expect("a CRD"));
            }
        }
    }
    assert!(
        crds.iter()
            .any(|c: &CustomResourceDefinition| c.name_any()
                == "httproutes.gateway.networking.k8s.io"),
        "no HTTPRoute CRD in {dir}"
    );
    crds
}

async fn remove_gateway_api(client: &Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let _ = api.delete(&crd.name_any(), &DeleteParams::default()).await;
    }
    for crd in crds {
        eventually(&format!("{} to be gone", crd.name_any()), || async {
            api.get_opt(&crd.name_any())
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }
}

async fn install_gateway_api(client: &Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        api.patch(
            &crd.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .expect("apply a Gateway API CRD");
    }
    eventually("the HTTPRoute CRD to be established", || async {
        let crd = api.get("httproutes.gateway.networking.k8s.io").await.ok()?;
        crd.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
}

fn condition(route: &RealtimeRoute, type_: &str) -> Option<(String, String, String)> {
    route
        .condition(type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Make the controller look at the route now (an annotation edit is a watch event).
async fn nudge(routes: &Api<RealtimeRoute>, name: &str, n: u32) {
    let body =
        serde_json::json!({"metadata": {"annotations": {"e2e.patchbay.dev/nudge": n.to_string()}}});
    routes
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .expect("nudge the route");
}

#[tokio::test]
#[ignore = "needs PATCHBAY_E2E_KUBECONFIG (a throwaway cluster) and PATCHBAY_E2E_GATEWAY_API_CRDS; see docs/operator.md"]
async fn gateway_api_exposure_owns_an_http_route_and_reports_its_parents() {
    let kubeconfig = kubeconfig();
    let admin = client_from(&kubeconfig).await;
    let crds = gateway_api_crds();
    install_crds(&admin).await;
    // As the operator's account when the chart's RBAC is given: the HTTPRoute verbs are its.
    let operator = match std::env::var(CHART_ENV) {
        Ok(rendered) => {
            install_chart_rbac(&admin, &rendered).await;
            operator_client(&kubeconfig).await
        }
        Err(_) => admin.clone(),
    };
    let namespace = fresh_namespace(&admin, "patchbay-e2e-gwapi").await;
    // The Secrets the route names, so its pods start (else Degraded says PodsNotStarting first).
    create_example_secrets(&admin, &namespace).await;
    remove_gateway_api(&admin, &crds).await;
    let (shutdown, controller) = run_controller(&operator, &namespace);

    let routes: Api<RealtimeRoute> = Api::namespaced(admin.clone(), &namespace);
    let one = serde_json::json!({"apiKeySecretRef": {"name": "openai", "key": "api-key"}});
    let expose = serde_json::json!({
        "parentRefs": [{"name": "public", "sectionName": "web"}],
        "hostnames": ["voice.example.com"],
        "pathPrefix": "/voice",
    });
    let route: RealtimeRoute = serde_json::from_value(route_json(
        "voice",
        serde_json::json!({"upstream": one, "expose": expose}),
    ))
    .unwrap();
    let created = routes
        .create(&PostParams::default(), &route)
        .await
        .expect("create the exposed route");

    // 1. No Gateway API: degraded, and the rest reconciled.
    let degraded = eventually("Degraded=GatewayAPIUnavailable", || async {
        let r = routes.get("voice").await.ok()?;
        condition(&r, "Degraded").filter(|c| c.1 == "GatewayAPIUnavailable")
    })
    .await;
    assert_eq!(degraded.0, "True");
    assert!(degraded.2.contains("Gateway API"), "{}", degraded.2);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &namespace);
    deployments
        .get("voice-gateway")
        .await
        .expect("the Deployment is reconciled all the same");
    let services: Api<Service> = Api::namespaced(admin.clone(), &namespace);
    services.get("voice").await.expect("and the Service");

    // 2. The CRDs arrive: the owned HTTPRoute is applied.
    install_gateway_api(&admin, &crds).await;
    nudge(&routes, "voice", 1).await;
    let http_routes: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &namespace,
        &resource("HTTPRoute", "httproutes"),
    );
    let applied = eventually("the HTTPRoute", || async {
        http_routes.get("voice").await.ok()
    })
    .await;
    let owner = &applied.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, created.uid().unwrap());
    assert_eq!(owner.controller, Some(true));
    let spec = &applied.data["spec"];
    assert_eq!(spec["parentRefs"][0]["name"], "public");
    assert_eq!(spec["parentRefs"][0]["sectionName"], "web");
    assert_eq!(spec["hostnames"], serde_json::json!(["voice.example.com"]));
    let rules = spec["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 4);
    assert_eq!(
        rules[0]["matches"][0]["path"]["value"],
        "/voice/v1/realtime"
    );
    assert_eq!(
        rules[0]["filters"][0]["urlRewrite"]["path"]["replacePrefixMatch"],
        "/v1/realtime"
    );
    assert_eq!(rules[0]["backendRefs"][0]["name"], "voice");
    assert_eq!(rules[0]["backendRefs"][0]["port"], 8080);
    assert_eq!(rules[0]["timeouts"]["request"], "3600s");
    let pending = eventually("Exposed=False/Pending, no longer degraded", || async {
        let r = routes.get("voice").await.ok()?;
        let degraded = condition(&r, "Degraded")?;
        (degraded.0 == "False").then_some(())?;
        condition(&r, "Exposed")
    })
    .await;
    assert_eq!(
        (pending.0.as_str(), pending.1.as_str()),
        ("False", "Pending")
    );

    // 3. A Gateway controller (played here) accepts the route; its Gateway has an address.
    let gateways: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &namespace, &resource("Gateway", "gateways"));
    let gateway: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "public"},
        "spec": {"gatewayClassName": "e2e", "listeners": [
            {"name": "web", "port": 8000, "protocol": "HTTP"}
        ]}
    }))
    .unwrap();
    gateways
        .create(&PostParams::default(), &gateway)
        .await
        .expect("create the Gateway");
    let gateway_status = serde_json::json!({"status": {
        "addresses": [{"type": "IPAddress", "value": "198.51.100.9"}]
    }});
    gateways
        .patch_status(
            "public",
            &PatchParams::default(),
            &Patch::Merge(&gateway_status),
        )
        .await
        .expect("the Gateway's address");
    let verdict = serde_json::json!({"status": {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                      "name": "public", "sectionName": "web"},
        "controllerName": "e2e.patchbay.dev/gateway",
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}
        ]
    }]}});
    http_routes
        .patch_status("voice", &PatchParams::default(), &Patch::Merge(&verdict))
        .await
        .expect("the parent's verdict");
    nudge(&routes, "voice", 2).await;
    let exposed = eventually("Exposed=True with the Gateway's URL", || async {
        let r = routes.get("voice").await.ok()?;
        let c = condition(&r, "Exposed").filter(|c| c.0 == "True")?;
        Some((c, r.status?.exposure?))
    })
    .await;
    assert_eq!(
        exposed.1.urls,
        vec!["ws://voice.example.com:8000/voice/v1/realtime".to_string()]
    );
    assert_eq!(
        exposed.1.parents[0].parent,
        format!("{namespace}/public/web")
    );
    assert_eq!(exposed.1.parents[0].accepted, "True");
    assert!(exposed
        .0
         .2
        .contains("ws://voice.example.com:8000/voice/v1/realtime"));

    // 4. Someone else's HTTPRoute holds another route's name: refused, left as it was.
    let foreign: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "taken"},
        "spec": {"parentRefs": [{"name": "public"}], "rules": [{"backendRefs": [{"name": "other", "port": 80}]}]}
    }))
    .unwrap();
    http_routes
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create a foreign HTTPRoute");
    let taken: RealtimeRoute = serde_json::from_value(route_json(
        "taken",
        serde_json::json!({"upstream": one, "expose": {"parentRefs": [{"name": "public"}]}}),
    ))
    .unwrap();
    routes
        .create(&PostParams::default(), &taken)
        .await
        .expect("create the second route");
    let refused = eventually("Degraded=NameTaken on the HTTPRoute", || async {
        let r = routes.get("taken").await.ok()?;
        condition(&r, "Degraded").filter(|c| c.1 == "NameTaken")
    })
    .await;
    assert!(
        refused.2.contains(&format!("HTTPRoute {namespace}/taken")),
        "{}",
        refused.2
    );
    let still = http_routes.get("taken").await.unwrap();
    assert!(still.metadata.owner_references.is_none());
    assert_eq!(
        still.data["spec"]["rules"][0]["backendRefs"][0]["name"],
        "other"
    );

    // 5. The route stops asking for exposure: its HTTPRoute goes.
    let drop_expose = serde_json::json!({"spec": {"expose": null}});
    routes
        .patch(
            "voice",
            &PatchParams::default(),
            &Patch::Merge(&drop_expose),
        )
        .await
        .expect("drop spec.expose");
    eventually("the owned HTTPRoute to be deleted", || async {
        http_routes
            .get_opt("voice")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let after = routes.get("voice").await.unwrap();
    assert!(condition(&after, "Exposed").is_none());
    assert!(after.status.unwrap().exposure.is_none());

    shutdown.cancel();
    controller.await.expect("controller stops");
    delete_namespace(&admin, &namespace).await;
}
