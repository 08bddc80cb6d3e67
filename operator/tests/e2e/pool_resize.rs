//! Pools resized in seconds, on real pods: a route's gateway Deployment scaled 2 → 4 → 2 (as
//! `kubectl scale` does, through the scale subresource) and every running pod's
//! `patchbay_pool_target_sockets` reaching `ceil(peakConcurrency / replicas)` within 10 s, with
//! no restart and no new ReplicaSet.
//!
//! Needs a cluster whose node runs the gateway image (`PATCHBAY_E2E_REAL_PODS=1`; the image the
//! route names, `patchbay/gateway:0.1.0`, must be on the node: see docs/operator.md). The pods'
//! `/metrics` are read through the API server's pod proxy, so nothing here needs a route to the
//! pod network. Each measured time is printed (`--nocapture`).

use super::*;
use std::time::Instant;

const REAL_PODS_ENV: &str = "PATCHBAY_E2E_REAL_PODS";
/// The bound the issue sets on a running pod learning its new pool size.
const RESIZE_BOUND: Duration = Duration::from_secs(10);

/// A pod's summed `patchbay_pool_target_sockets`, read through the API server's pod proxy.
async fn pool_target(client: &Client, namespace: &str, pod: &str) -> Option<i64> {
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}:9090/proxy/metrics"
    ))
    .body(Vec::new())
    .unwrap();
    let text = client.request_text(request).await.ok()?;
    patchbay_operator::deletion_cost::scrape::sum_of(&text, "patchbay_pool_target_sockets")
        .map(|v| v.round() as i64)
}

/// The running gateway pods (containers started, not being deleted) and their restart counts.
async fn running_pods(pods: &Api<k8s_openapi::api::core::v1::Pod>) -> Vec<(String, i32)> {
    let list = pods
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=pool"))
        .await
        .expect("list pods");
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status?;
            let started = status
                .container_statuses
                .as_ref()?
                .iter()
                .all(|c| c.started == Some(true));
            (status.phase.as_deref() == Some("Running") && started).then(|| {
                let restarts = status
                    .container_statuses
                    .unwrap_or_default()
                    .iter()
                    .map(|c| c.restart_count)
                    .sum();
                (p.metadata.name.unwrap_or_default(), restarts)
            })
        })
        .collect()
}

async fn scale(deployments: &Api<Deployment>, replicas: i32) {
    let body = serde_json::json!({"spec": {"replicas": replicas}});
    deployments
        .patch_scale(
            "pool-gateway",
            &PatchParams::default(),
            &Patch::Merge(&body),
        )
        .await
        .expect("scale the Deployment");
}

/// Wait until each of `pods` reports `target`; returns the time each took from `since`.
async fn each_reaches(
    client: &Client,
    namespace: &str,
    pods: &[String],
    target: i64,
    since: Instant,
) -> Vec<(String, Duration)> {
    let mut times = Vec::new();
    for pod in pods {
        loop {
            if pool_target(client, namespace, pod).await == Some(target) {
                times.push((pod.clone(), since.elapsed()));
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(60),
                "pod {pod} never reached a pool target of {target}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    times
}

#[tokio::test]
#[ignore = "needs PATCHBAY_E2E_KUBECONFIG (a throwaway cluster with a node) and PATCHBAY_E2E_REAL_PODS=1; see docs/operator.md"]
async fn real_pods_learn_a_new_pool_size_within_seconds_of_a_scale_without_restarting() {
    let kubeconfig = kubeconfig();
    assert!(
        std::env::var(REAL_PODS_ENV).is_ok(),
        "{REAL_PODS_ENV} is not set: this test needs a node that runs the gateway image \
         (see docs/operator.md); run the others with `--skip real_pods`"
    );
    let admin = client_from(&kubeconfig).await;
    install_crds(&admin).await;
    let namespace = fresh_namespace(&admin, "patchbay-e2e-pool").await;
    create_example_secrets(&admin, &namespace).await;
    let (shutdown, controller) = run_controller(&admin, &namespace);
    let routes: Api<RealtimeRoute> = Api::namespaced(admin.clone(), &namespace);
    // Autoscaled between 2 and 4 on CPU: with no metrics server the HPA never moves the
    // count, so the scale below holds, as a manual `kubectl scale` of an HPA-less route would.
    let route: RealtimeRoute = serde_json::from_value(route_json(
        "pool",
        serde_json::json!({
            "upstream": {"apiKeySecretRef": {"name": "openai", "key": "api-key"}},
            "peakConcurrency": 8,
            "replicas": {"min": 2, "max": 4},
            "autoscaling": {"targetCPUUtilizationPercentage": 70},
        }),
    ))
    .unwrap();
    routes
        .create(&PostParams::default(), &route)
        .await
        .expect("create the route");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(admin.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &namespace);

    // Two running pods, each with a pool of ceil(8 / 2) = 4.
    let first = eventually("two running gateway pods", || async {
        let running = running_pods(&pods).await;
        (running.len() == 2).then_some(running)
    })
    .await;
    let names: Vec<String> = first.iter().map(|(n, _)| n.clone()).collect();
    each_reaches(&admin, &namespace, &names, 4, Instant::now()).await;
    let replica_sets = || async {
        let rs: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
            Api::namespaced(admin.clone(), &namespace);
        rs.list(&kube::api::ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(replica_sets().await, 1);

    // 2 → 4: the two running pods go to ceil(8 / 4) = 2.
    let t0 = Instant::now();
    scale(&deployments, 4).await;
    let up = each_reaches(&admin, &namespace, &names, 2, t0).await;
    println!("scale 2 -> 4: pool target 4 -> 2 reached after {up:?}");
    // The new pods start with the new size too.
    let four = eventually("four running gateway pods", || async {
        let running = running_pods(&pods).await;
        (running.len() == 4).then_some(running)
    })
    .await;
    let all: Vec<String> = four.iter().map(|(n, _)| n.clone()).collect();
    each_reaches(&admin, &namespace, &all, 2, Instant::now()).await;

    // 4 → 2: the pods that stay go back to 4.
    let t1 = Instant::now();
    scale(&deployments, 2).await;
    let stay = eventually("two pods left running", || async {
        let running = running_pods(&pods).await;
        (running.len() == 2).then_some(running)
    })
    .await;
    let staying: Vec<String> = stay.iter().map(|(n, _)| n.clone()).collect();
    let down = each_reaches(&admin, &namespace, &staying, 4, t1).await;
    println!("scale 4 -> 2: pool target 2 -> 4 reached after {down:?}");

    for (pod, took) in up.iter().chain(&down) {
        assert!(
            *took <= RESIZE_BOUND,
            "pod {pod} took {took:?} to learn its new pool size"
        );
    }
    // No restart, no rollout: the same pods, the one ReplicaSet.
    for (pod, restarts) in running_pods(&pods).await {
        assert_eq!(restarts, 0, "pod {pod} restarted");
    }
    assert_eq!(replica_sets().await, 1, "a scale makes no new ReplicaSet");

    shutdown.cancel();
    controller.await.expect("controller stops");
    delete_namespace(&admin, &namespace).await;
}
