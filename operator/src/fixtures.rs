//! Test fixtures: routes and a mocked API server.
//!
//! The mock is a `tower_test::mock::pair` behind a real `kube::Client`: a test spawns the
//! reconcile, then answers each request the client makes, in order, asserting its method, path
//! (with query) and body. A request the test did not expect fails it; so does a missing one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{Affinity, Toleration};
use kube::client::Body;
use kube::Client;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tower_test::mock::{self, Handle, SendResponse};

use crate::context::Context;
use crate::crd::{
    Autoscaling, ClientSecrets, ClientTls, Drain, Endpoint, GatewayPod, Intent, Metering,
    NamedUpstream, Open, Pool, Price, Protocol, Provider, RealtimeRoute, RealtimeRouteSpec,
    Replicas, SecretKeyRef, SigningKeysRef, Unpriced, Upstream,
};
use crate::metrics::Metrics;

pub const ROUTE_NAME: &str = "voice";
pub const NAMESPACE: &str = "realtime";
pub const ROUTE_UID: &str = "6f1c2a4e-0000-4000-8000-000000000001";

fn secret(name: &str, key: &str) -> SecretKeyRef {
    SecretKeyRef {
        name: name.into(),
        key: key.into(),
    }
}

/// Only the required fields; every default applies.
pub fn minimal_spec() -> RealtimeRouteSpec {
    serde_json::from_value(json!({
        "model": "gpt-realtime",
        "upstream": {"apiKeySecretRef": {"name": "openai", "key": "api-key"}},
        "clientKeysSecretRef": {"name": "voice-keys", "key": "keys.toml"}
    }))
    .expect("minimal spec")
}

/// 500 peak sessions over 2..10 replicas, scaled on sessions and CPU.
pub fn autoscaled_spec() -> RealtimeRouteSpec {
    RealtimeRouteSpec {
        peak_concurrency: 500,
        replicas: Replicas {
            min: 2,
            max: Some(10),
        },
        autoscaling: Some(Autoscaling {
            target_active_sessions_per_pod: Some(40),
            target_cpu_utilization_percentage: Some(70),
        }),
        ..minimal_spec()
    }
}

/// Every field set.
pub fn full_spec() -> RealtimeRouteSpec {
    RealtimeRouteSpec {
        model: "gpt-realtime".into(),
        intent: Some(Intent::Transcription),
        endpoint: Endpoint::Realtime,
        upstream: Some(Upstream {
            provider: Provider::Openai,
            url: Some("wss://api.openai.com/v1/realtime".into()),
            model: Some("gpt-realtime-2025-08-28".into()),
            protocol: Protocol::Ga,
            api_key_secret_ref: secret("openai", "api-key"),
        }),
        upstreams: Vec::new(),
        peak_concurrency: 500,
        replicas: Replicas {
            min: 2,
            max: Some(10),
        },
        autoscaling: Some(Autoscaling {
            target_active_sessions_per_pod: Some(40),
            target_cpu_utilization_percentage: Some(70),
        }),
        pool: Pool {
            size: None,
            max_idle_seconds: 30,
            max_size: 512,
        },
        metering: Metering {
            flush_seconds: 15,
            redis_url_secret_ref: Some(secret("redis", "url")),
            unpriced: Unpriced::Block,
            prices: vec![Price {
                model: "gpt-realtime".into(),
                text_input: 4.0,
                cached_text_input: 0.4,
                audio_input: 32.0,
                cached_audio_input: 0.4,
                text_output: 16.0,
                audio_output: 64.0,
                usd_per_minute: None,
            }],
        },
        client_keys_secret_ref: secret("voice-keys", "keys.toml"),
        drain: Drain {
            wait_seconds: 20,
            pre_stop_sleep_seconds: 5,
            mode: crate::crd::DrainMode::Linger,
            linger_seconds: 60,
        },
        gateway: GatewayPod {
            image: Some("registry.example/patchbay/gateway:1.2.3".into()),
            resources: None,
            node_selector: Some(BTreeMap::from([("pool".into(), "realtime".into())])),
            tolerations: Some(Open::new(&vec![Toleration {
                key: Some("realtime".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            }])),
            affinity: Some(Open::new(&serde_json::from_value::<Affinity>(json!({
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "voice"}}
                    }
                }]}
            }))
            .expect("affinity"))),
            image_pull_policy: Some(crate::crd::ImagePullPolicy::IfNotPresent),
            image_pull_secrets: vec![crate::crd::PullSecretRef {
                name: "regcred".into(),
            }],
            priority_class_name: Some("realtime-critical".into()),
            pod_labels: BTreeMap::from([("team".into(), "voice".into())]),
            pod_annotations: BTreeMap::from([(
                "prometheus.io/scrape".into(),
                "true".into(),
            )]),
            topology_spread_constraints: Some(Open::new(&vec![serde_json::from_value::<
                k8s_openapi::api::core::v1::TopologySpreadConstraint,
            >(json!({
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway"
            }))
            .expect("topology spread constraint")])),
        },
        client_secrets: Some(ClientSecrets {
            signing_keys_secret_ref: SigningKeysRef {
                name: "signing".into(),
                key: None,
                keys: vec!["current".into(), "previous".into()],
            },
            max_ttl_seconds: Some(600),
        }),
        tls: Some(ClientTls {
            secret_name: "voice-tls".into(),
        }),
        expose: None,
        telemetry: None,
    }
}

/// The full spec with two upstreams instead of one: OpenAI preferred (weight 3), an Azure
/// deployment behind it with its own Secret and a CA; the OpenAI key and the Azure CA share
/// one Secret.
pub fn two_upstream_spec() -> RealtimeRouteSpec {
    RealtimeRouteSpec {
        upstream: None,
        upstreams: vec![
            NamedUpstream {
                name: "openai".into(),
                provider: Provider::Openai,
                url: None,
                model: None,
                protocol: Protocol::Ga,
                api_key_secret_ref: secret("openai", "api-key"),
                ca_secret_ref: None,
                priority: 0,
                weight: 3,
            },
            NamedUpstream {
                name: "azure-eastus".into(),
                provider: Provider::Azure,
                url: Some("wss://eastus.openai.azure.com/openai/v1/realtime".into()),
                model: Some("my-deployment".into()),
                protocol: Protocol::Ga,
                api_key_secret_ref: secret("azure", "key"),
                ca_secret_ref: Some(secret("openai", "ca.pem")),
                priority: 1,
                weight: 1,
            },
        ],
        ..full_spec()
    }
}

/// The single upstream of a spec built from [`minimal_spec`] or [`full_spec`].
pub fn single(spec: &mut RealtimeRouteSpec) -> &mut Upstream {
    spec.upstream.as_mut().expect("a single-upstream spec")
}

/// A route as the API server would hand it to the controller: named, namespaced, with a uid.
pub fn route(spec: RealtimeRouteSpec) -> RealtimeRoute {
    let mut route = RealtimeRoute::new(ROUTE_NAME, spec);
    route.metadata.namespace = Some(NAMESPACE.into());
    route.metadata.uid = Some(ROUTE_UID.into());
    route.metadata.generation = Some(1);
    route
}

/// A request the mocked API server received.
#[derive(Debug)]
pub struct Seen {
    pub method: Method,
    /// Path and query, e.g. `/api/v1/namespaces/realtime/configmaps/voice-gateway?&force=true&fieldManager=patchbay-operator`.
    pub uri: String,
    /// The body as JSON (`Null` when empty).
    pub body: Value,
}

/// The API server side of a mocked client.
pub struct ApiServer {
    handle: Handle<Request<Body>, Response<Body>>,
}

/// One pending answer.
pub struct Reply(SendResponse<Response<Body>>);

impl Reply {
    pub fn json(self, status: StatusCode, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response");
        self.0.send_response(response);
    }

    pub fn ok(self, body: &Value) {
        self.json(StatusCode::OK, body);
    }

    /// How the API server answers a path it serves nothing at (a resource whose CRD is not
    /// installed, an API group it does not have): plain text, not a `Status`.
    pub fn page_not_found(self) {
        let response = Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Body::from(b"404 page not found\n".to_vec()))
            .expect("response");
        self.0.send_response(response);
    }

    pub fn not_found(self, what: &str) {
        self.json(
            StatusCode::NOT_FOUND,
            &json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": format!("{what} not found"), "reason": "NotFound", "code": 404
            }),
        );
    }
}

impl ApiServer {
    /// The next request, or a panic if none arrives within a few seconds.
    pub async fn next(&mut self) -> (Seen, Reply) {
        let (request, send) =
            tokio::time::timeout(Duration::from_secs(5), self.handle.next_request())
                .await
                .expect("the client made no further request")
                .expect("the client is gone");
        let (parts, body) = request.into_parts();
        let bytes = body.collect().await.expect("request body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("request body is JSON")
        };
        let uri = parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        (
            Seen {
                method: parts.method,
                uri,
                body,
            },
            Reply(send),
        )
    }

    /// The next request must be `method` on `uri`; returns it for body assertions.
    pub async fn expect(&mut self, method: Method, uri: &str) -> (Seen, Reply) {
        let (seen, reply) = self.next().await;
        assert_eq!(
            (&seen.method, seen.uri.as_str()),
            (&method, uri),
            "unexpected request"
        );
        (seen, reply)
    }

    /// Answer an event publication (`POST .../events`) by echoing it, returning its reason.
    pub async fn expect_event(&mut self) -> (String, String) {
        let (seen, reply) = self
            .expect(
                Method::POST,
                &format!("/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events?"),
            )
            .await;
        let reason = seen.body["reason"].as_str().unwrap_or_default().to_string();
        let type_ = seen.body["type"].as_str().unwrap_or_default().to_string();
        reply.ok(&seen.body);
        (type_, reason)
    }

    /// Nothing more is asked of the API server.
    pub async fn expect_silence(&mut self) {
        let next =
            tokio::time::timeout(Duration::from_millis(100), self.handle.next_request()).await;
        assert!(
            !matches!(next, Ok(Some(_))),
            "unexpected extra request to the API server"
        );
    }
}

/// A context on a mocked client, its API server, and the registry its metrics live in.
pub fn mock_context() -> (Arc<Context>, ApiServer, Registry) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let metrics = Metrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let ctx = Context::new(
        client,
        metrics,
        "patchbay/gateway:test".into(),
        Some("test-pod".into()),
    );
    (Arc::new(ctx), ApiServer { handle }, registry)
}
