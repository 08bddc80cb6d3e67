//! Deployment `<name>-gateway`.
//!
//! The pod runs `patchbay-gateway serve --config /etc/patchbay/config/gateway.toml` with the two
//! ConfigMaps and the referenced Secrets (upstream key, or one volume per distinct Secret of
//! `spec.upstreams`; Redis URL; client keys; client-secret signing keys; the client listener's
//! certificate) mounted as
//! directories (never `subPath`: a `subPath` mount is never updated, and these files change live).
//! The gateway re-reads each file when it changes, so rotating a Secret restarts nothing; the
//! operator never reads a Secret. A missing Secret keeps the pod in `ContainerCreating` with a
//! `FailedMount` event, which the route's status reports (`Degraded=True/PodsNotStarting`), as it
//! reports a gateway that exits at start: the container's `terminationMessagePolicy` is
//! `FallbackToLogsOnError`, so its last termination carries the end of its output.
//!
//! Shutdown is budgeted: the kubelet runs `preStop: sleep` while endpoints controllers take the
//! pod out of the Service, then sends SIGTERM and the gateway drains for `waitSeconds` (plus
//! `lingerSeconds` in linger mode). `terminationGracePeriodSeconds` covers all of that plus
//! [`GRACE_MARGIN_SECONDS`], so SIGKILL never cuts a drain short.
//!
//! `spec.replicas` is left out while an HPA owns scaling: with server-side apply, a field the
//! operator sets is a field it owns, and every reconcile would undo the HPA.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    HTTPGetAction, KeyToPath, Lifecycle, LifecycleHandler, LocalObjectReference,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecretVolumeSource, SecurityContext, SleepAction, TopologySpreadConstraint, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{child_meta, gateway_name, labels, pool_name, selector_labels};
use crate::crd::{DrainMode, RealtimeRoute, RealtimeRouteSpec, SecretKeyRef};
use crate::gateway_config::{
    config_path, signing_keys_mount, tls_mount, upstream_secret_mounts, SecretMount, ADMIN_PORT,
    CONFIG_DIR, HTTP_PORT, KEYS_DIR, POOL_DIR, REDIS_URL_DIR, UPSTREAM_KEY_DIR,
};

/// Pod-template annotation carrying the gateway config hash.
pub const CONFIG_HASH_ANNOTATION: &str = "patchbay.dev/config-hash";
/// Seconds of grace beyond the drain budget, for the last flush of usage records and exit.
pub const GRACE_MARGIN_SECONDS: i64 = 10;
const _: () = assert!(
    GRACE_MARGIN_SECONDS >= 5,
    "the grace margin is at least 5 s"
);
/// Name of the gateway container.
pub const CONTAINER_NAME: &str = "gateway";
/// The gateway container's `terminationMessagePolicy`: its last output when it fails.
pub const TERMINATION_MESSAGE_POLICY: &str = "FallbackToLogsOnError";
/// UID/GID the gateway runs as (the distroless `nonroot` user).
const NON_ROOT_ID: i64 = 65532;
const TMP_SIZE_LIMIT: &str = "64Mi";
const DEFAULT_CPU_REQUEST: &str = "100m";
const DEFAULT_MEMORY_REQUEST: &str = "128Mi";
const DEFAULT_MEMORY_LIMIT: &str = "512Mi";

/// `preStopSleepSeconds + waitSeconds (+ lingerSeconds in linger mode) + margin`.
pub fn termination_grace_period_seconds(spec: &RealtimeRouteSpec) -> i64 {
    let drain = &spec.drain;
    let linger = match drain.mode {
        DrainMode::Linger => i64::from(drain.linger_seconds.max(0)),
        DrainMode::Close => 0,
    };
    i64::from(drain.pre_stop_sleep_seconds.max(0))
        + i64::from(drain.wait_seconds.max(0))
        + linger
        + GRACE_MARGIN_SECONDS
}

pub fn deployment(route: &RealtimeRoute, default_image: &str, config_hash: &str) -> Deployment {
    let spec = &route.spec;
    // The route's own pod labels and annotations first, the operator's over them: validation
    // refuses a route that names one of the operator's keys, and this order keeps the selector
    // intact even so.
    let mut pod_labels = spec.gateway.pod_labels.clone();
    pod_labels.extend(labels(route));
    let mut annotations = spec.gateway.pod_annotations.clone();
    annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string());
    Deployment {
        metadata: child_meta(route, gateway_name(route)),
        spec: Some(DeploymentSpec {
            replicas: (!spec.replicas.autoscaled()).then_some(spec.replicas.min),
            selector: LabelSelector {
                match_labels: Some(selector_labels(route)),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::String("25%".into())),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(route, default_image)),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

fn pod_spec(route: &RealtimeRoute, default_image: &str) -> PodSpec {
    let spec = &route.spec;
    let mut volumes = vec![
        config_map_volume("config", gateway_name(route)),
        config_map_volume("pool", pool_name(route)),
        secret_volume("keys", &spec.client_keys_secret_ref),
    ];
    if let Some(up) = &spec.upstream {
        volumes.push(secret_volume("upstream-key", &up.api_key_secret_ref));
    }
    if let Some(redis) = &spec.metering.redis_url_secret_ref {
        volumes.push(secret_volume("redis-url", redis));
    }
    volumes.extend(secret_mounts(spec).iter().map(secret_mount_volume));
    volumes.push(Volume {
        name: "tmp".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(TMP_SIZE_LIMIT.into())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    });
    PodSpec {
        containers: vec![container(spec, default_image)],
        termination_grace_period_seconds: Some(termination_grace_period_seconds(spec)),
        // The token reads the pool ConfigMap and nothing else (see `build::rbac`).
        service_account_name: Some(super::meta::gateway_name(route)),
        automount_service_account_token: Some(true),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(NON_ROOT_ID),
            run_as_group: Some(NON_ROOT_ID),
            fs_group: Some(NON_ROOT_ID),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..PodSecurityContext::default()
        }),
        volumes: Some(volumes),
        node_selector: spec.gateway.node_selector.clone(),
        // Checked by `validate::check_spec` before anything is built.
        tolerations: spec.gateway.tolerations.as_ref().and_then(|t| t.get().ok()),
        affinity: spec.gateway.affinity.as_ref().and_then(|a| a.get().ok()),
        topology_spread_constraints: topology_spread_constraints(route),
        priority_class_name: spec.gateway.priority_class_name.clone(),
        image_pull_secrets: (!spec.gateway.image_pull_secrets.is_empty()).then(|| {
            spec.gateway
                .image_pull_secrets
                .iter()
                .map(|s| LocalObjectReference {
                    name: s.name.clone(),
                })
                .collect()
        }),
        ..PodSpec::default()
    }
}

/// `gateway.topologySpreadConstraints`, each without a `labelSelector` given the route's pod
/// selector: a constraint that selects no pods would spread nothing.
fn topology_spread_constraints(route: &RealtimeRoute) -> Option<Vec<TopologySpreadConstraint>> {
    // Checked by `validate::check_spec` before anything is built.
    let mut constraints = route
        .spec
        .gateway
        .topology_spread_constraints
        .as_ref()?
        .get()
        .ok()?;
    for c in &mut constraints {
        c.label_selector.get_or_insert_with(|| LabelSelector {
            match_labels: Some(selector_labels(route)),
            ..LabelSelector::default()
        });
    }
    Some(constraints)
}

fn container(spec: &RealtimeRouteSpec, default_image: &str) -> Container {
    let mut mounts = vec![
        read_only_mount("config", CONFIG_DIR),
        read_only_mount("pool", POOL_DIR),
        read_only_mount("keys", KEYS_DIR),
    ];
    if spec.upstream.is_some() {
        mounts.push(read_only_mount("upstream-key", UPSTREAM_KEY_DIR));
    }
    if spec.metering.redis_url_secret_ref.is_some() {
        mounts.push(read_only_mount("redis-url", REDIS_URL_DIR));
    }
    mounts.extend(
        secret_mounts(spec)
            .iter()
            .map(|m| read_only_mount(&m.volume, &m.dir)),
    );
    mounts.push(VolumeMount {
        name: "tmp".into(),
        mount_path: "/tmp".into(),
        ..VolumeMount::default()
    });
    Container {
        name: CONTAINER_NAME.into(),
        image: Some(
            spec.gateway
                .image
                .clone()
                .unwrap_or_else(|| default_image.to_string()),
        ),
        image_pull_policy: spec
            .gateway
            .image_pull_policy
            .map(|p| p.as_str().to_string()),
        args: Some(vec!["serve".into(), "--config".into(), config_path()]),
        ports: Some(vec![
            container_port("http", HTTP_PORT),
            container_port("metrics", ADMIN_PORT),
        ]),
        volume_mounts: Some(mounts),
        // A gateway that exits at start (a config it refuses) says why on stderr; this makes the
        // end of that output its termination message, which the route's status then reports.
        termination_message_policy: Some(TERMINATION_MESSAGE_POLICY.into()),
        readiness_probe: Some(Probe {
            http_get: Some(admin_get("/readyz")),
            period_seconds: Some(5),
            timeout_seconds: Some(2),
            failure_threshold: Some(2),
            ..Probe::default()
        }),
        liveness_probe: Some(Probe {
            http_get: Some(admin_get("/healthz")),
            initial_delay_seconds: Some(5),
            period_seconds: Some(10),
            timeout_seconds: Some(2),
            failure_threshold: Some(3),
            ..Probe::default()
        }),
        // No hook at 0: Kubernetes before 1.33 refuses `sleep: {seconds: 0}`.
        lifecycle: (spec.drain.pre_stop_sleep_seconds > 0).then(|| Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: i64::from(spec.drain.pre_stop_sleep_seconds),
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        resources: Some(
            spec.gateway
                .resources
                .as_ref()
                .and_then(|r| r.get().ok())
                .unwrap_or_else(default_resources),
        ),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(DEFAULT_CPU_REQUEST.into())),
            (
                "memory".to_string(),
                Quantity(DEFAULT_MEMORY_REQUEST.into()),
            ),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(DEFAULT_MEMORY_LIMIT.into()),
        )])),
        ..ResourceRequirements::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..SeccompProfile::default()
    }
}

/// A Secret volume holding one key of `secret` as a file of the same name. Not optional: a
/// missing Secret or key keeps the pod from starting (`FailedMount`) rather than starting a
/// gateway without its credentials.
fn secret_volume(name: &str, secret: &SecretKeyRef) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.name.clone()),
            items: Some(vec![KeyToPath {
                key: secret.key.clone(),
                path: secret.key.clone(),
                ..KeyToPath::default()
            }]),
            optional: Some(false),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The Secrets mounted whole-directory with several keys: those of `spec.upstreams`, the
/// client-secret signing keys and the client listener's certificate.
fn secret_mounts(spec: &RealtimeRouteSpec) -> Vec<SecretMount> {
    let mut mounts = upstream_secret_mounts(spec);
    mounts.extend(signing_keys_mount(spec));
    mounts.extend(tls_mount(spec));
    mounts
}

/// A Secret volume projecting exactly `mount.keys`, each as a file of the same name; not
/// optional, as [`secret_volume`].
fn secret_mount_volume(mount: &SecretMount) -> Volume {
    Volume {
        name: mount.volume.clone(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(mount.secret.clone()),
            items: Some(
                mount
                    .keys
                    .iter()
                    .map(|k| KeyToPath {
                        key: k.clone(),
                        path: k.clone(),
                        ..KeyToPath::default()
                    })
                    .collect(),
            ),
            optional: Some(false),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn container_port(name: &str, port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: i32::from(port),
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

fn config_map_volume(name: &str, config_map: String) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map,
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn read_only_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

fn admin_get(path: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::String("metrics".into()),
        ..HTTPGetAction::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn build(spec: RealtimeRouteSpec) -> Deployment {
        deployment(&fixtures::route(spec), "patchbay/gateway:test", "abc")
    }

    fn pod(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn gateway(d: &Deployment) -> &Container {
        &pod(d).containers[0]
    }

    /// Every Secret volume: its name, its Secret and the keys it projects (comma-separated),
    /// checking that each is required and each key is its own file name.
    fn secret_volumes(d: &Deployment) -> Vec<(&str, &str, String)> {
        pod(d)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|v| {
                let s = v.secret.as_ref()?;
                assert_eq!(s.optional, Some(false), "{}", v.name);
                let items = s.items.as_ref().unwrap();
                assert!(items.iter().all(|i| i.key == i.path), "{}", v.name);
                let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
                Some((
                    v.name.as_str(),
                    s.secret_name.as_deref().unwrap(),
                    keys.join(","),
                ))
            })
            .collect()
    }

    fn mounts(d: &Deployment) -> Vec<(&str, &str)> {
        gateway(d)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect()
    }

    #[test]
    fn each_distinct_secret_of_the_upstreams_is_one_volume_with_the_keys_the_route_uses() {
        let d = build(fixtures::two_upstream_spec());
        assert_eq!(
            secret_volumes(&d),
            [
                ("keys", "voice-keys", "keys.toml".into()),
                ("redis-url", "redis", "url".into()),
                ("upstreams-0", "openai", "api-key,ca.pem".into()),
                ("upstreams-1", "azure", "key".into()),
                ("signing-keys", "signing", "current,previous".into()),
                ("tls", "voice-tls", "tls.crt,tls.key".into()),
            ]
        );
        let m = mounts(&d);
        assert!(m.contains(&("upstreams-0", "/etc/patchbay/upstreams/openai")));
        assert!(m.contains(&("upstreams-1", "/etc/patchbay/upstreams/azure")));
        assert!(m.contains(&("signing-keys", "/etc/patchbay/signing-keys")));
        assert!(
            !m.iter().any(|(name, _)| *name == "upstream-key"),
            "no single-upstream volume for a listed route"
        );
        for (name, _) in &m {
            assert!(
                pod(&d)
                    .volumes
                    .as_ref()
                    .unwrap()
                    .iter()
                    .any(|v| v.name == *name),
                "{name} is mounted and declared"
            );
        }
    }

    #[test]
    fn grace_period_in_close_mode_is_pre_stop_plus_wait_plus_margin() {
        let mut spec = fixtures::minimal_spec();
        spec.drain.pre_stop_sleep_seconds = 5;
        spec.drain.wait_seconds = 10;
        spec.drain.linger_seconds = 600; // ignored in close mode
        assert_eq!(termination_grace_period_seconds(&spec), 5 + 10 + 10);
    }

    #[test]
    fn grace_period_in_linger_mode_adds_the_linger_time() {
        let mut spec = fixtures::minimal_spec();
        spec.drain.mode = DrainMode::Linger;
        spec.drain.pre_stop_sleep_seconds = 3;
        spec.drain.wait_seconds = 20;
        spec.drain.linger_seconds = 120;
        assert_eq!(
            termination_grace_period_seconds(&spec),
            3 + 20 + 120 + GRACE_MARGIN_SECONDS
        );
        let d = build(spec);
        assert_eq!(
            pod(&d).termination_grace_period_seconds,
            Some(3 + 20 + 120 + GRACE_MARGIN_SECONDS)
        );
    }

    #[test]
    fn secrets_reach_the_pod_only_as_mounted_files_and_never_touch_the_template_metadata() {
        let d = build(fixtures::full_spec());
        let c = gateway(&d);
        assert!(
            c.env
                .as_ref()
                .is_none_or(|env| env.iter().all(|e| e.value_from.is_none())),
            "no env var from a Secret"
        );
        assert_eq!(
            secret_volumes(&d),
            [
                ("keys", "voice-keys", "keys.toml".into()),
                ("upstream-key", "openai", "api-key".into()),
                ("redis-url", "redis", "url".into()),
                ("signing-keys", "signing", "current,previous".into()),
                ("tls", "voice-tls", "tls.crt,tls.key".into()),
            ]
        );
        let annotations = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap();
        assert_eq!(
            annotations
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            // The route's own pod annotation, and the config hash.
            ["patchbay.dev/config-hash", "prometheus.io/scrape"],
            "nothing about Secrets on the template: rotating one rolls nothing"
        );
    }

    #[test]
    fn no_pre_stop_hook_when_the_sleep_is_zero() {
        let mut spec = fixtures::minimal_spec();
        spec.drain.pre_stop_sleep_seconds = 0;
        let d = build(spec);
        assert!(gateway(&d).lifecycle.is_none());
        assert_eq!(
            pod(&d).termination_grace_period_seconds,
            Some(10 + GRACE_MARGIN_SECONDS)
        );
    }

    #[test]
    fn default_drain_sleeps_five_seconds_before_sigterm() {
        let d = build(fixtures::minimal_spec());
        let sleep = gateway(&d)
            .lifecycle
            .as_ref()
            .unwrap()
            .pre_stop
            .as_ref()
            .unwrap()
            .sleep
            .as_ref()
            .unwrap();
        assert_eq!(sleep.seconds, 5);
        assert_eq!(
            pod(&d).termination_grace_period_seconds,
            Some(5 + 10 + GRACE_MARGIN_SECONDS)
        );
    }

    #[test]
    fn no_spec_replicas_while_an_hpa_owns_scaling() {
        let d = build(fixtures::autoscaled_spec());
        assert_eq!(d.spec.as_ref().unwrap().replicas, None);
        let json = serde_json::to_value(&d).unwrap();
        assert!(json["spec"].get("replicas").is_none());
    }

    #[test]
    fn a_fixed_count_sets_spec_replicas() {
        let mut spec = fixtures::minimal_spec();
        spec.replicas.min = 3;
        spec.replicas.max = Some(3);
        assert_eq!(build(spec).spec.unwrap().replicas, Some(3));
    }

    #[test]
    fn rolling_update_never_drops_below_the_desired_count() {
        let d = build(fixtures::minimal_spec());
        let rolling = d.spec.unwrap().strategy.unwrap().rolling_update.unwrap();
        assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
        assert_eq!(rolling.max_surge, Some(IntOrString::String("25%".into())));
    }

    #[test]
    fn the_pod_runs_non_root_read_only_without_capabilities() {
        let d = build(fixtures::minimal_spec());
        let pod_sc = pod(&d).security_context.as_ref().unwrap();
        assert_eq!(pod_sc.run_as_non_root, Some(true));
        assert_eq!(
            pod_sc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        let sc = gateway(&d).security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        let tmp = gateway(&d)
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == "/tmp");
        assert!(tmp.is_some(), "a writable /tmp under a read-only root");
    }

    #[test]
    fn the_container_follows_the_gateway_pod_contract() {
        let d = build(fixtures::full_spec());
        let c = gateway(&d);
        assert_eq!(
            c.image.as_deref(),
            Some("registry.example/patchbay/gateway:1.2.3")
        );
        assert_eq!(
            c.args.as_ref().unwrap(),
            &["serve", "--config", "/etc/patchbay/config/gateway.toml"]
        );
        let ports: Vec<(&str, i32)> = c
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.name.as_deref().unwrap(), p.container_port))
            .collect();
        assert_eq!(ports, [("http", 8080), ("metrics", 9090)]);
        let mounts: Vec<(&str, &str)> = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("config", "/etc/patchbay/config"),
                ("pool", "/etc/patchbay/pool"),
                ("keys", "/etc/patchbay/keys"),
                ("upstream-key", "/etc/patchbay/upstream"),
                ("redis-url", "/etc/patchbay/redis"),
                ("signing-keys", "/etc/patchbay/signing-keys"),
                ("tls", "/etc/patchbay/tls"),
                ("tmp", "/tmp"),
            ]
        );
        assert!(c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .all(|m| m.sub_path.is_none() && m.sub_path_expr.is_none()));
        let readiness = c
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(readiness.path.as_deref(), Some("/readyz"));
        assert_eq!(readiness.port, IntOrString::String("metrics".into()));
        let liveness = c
            .liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(liveness.path.as_deref(), Some("/healthz"));
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError"),
            "why a crash-looping gateway exits reaches the route's status"
        );
        let p = pod(&d);
        assert_eq!(p.node_selector.as_ref().unwrap()["pool"], "realtime");
        assert_eq!(p.tolerations.as_ref().unwrap().len(), 1);
        assert!(p.affinity.is_some());
        let volumes = p.volumes.as_ref().unwrap();
        assert_eq!(
            volumes[0].config_map.as_ref().unwrap().name,
            format!("{}-gateway", fixtures::ROUTE_NAME)
        );
        assert_eq!(
            volumes[1].config_map.as_ref().unwrap().name,
            format!("{}-pool", fixtures::ROUTE_NAME)
        );
        let keys = volumes[2].secret.as_ref().unwrap();
        assert_eq!(keys.secret_name.as_deref(), Some("voice-keys"));
        assert_eq!(keys.items.as_ref().unwrap()[0].path, "keys.toml");
    }

    #[test]
    fn pod_overrides_reach_the_pod_template() {
        let d = build(fixtures::full_spec());
        let pod = pod(&d);
        assert_eq!(
            pod.image_pull_secrets,
            Some(vec![LocalObjectReference {
                name: "regcred".into()
            }])
        );
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some("realtime-critical")
        );
        assert_eq!(
            gateway(&d).image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        let meta = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap();
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "voice");
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations["prometheus.io/scrape"], "true");
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION], "abc");
        let spread = pod.topology_spread_constraints.as_ref().unwrap();
        assert_eq!(spread[0].topology_key, "topology.kubernetes.io/zone");
        assert_eq!(spread[0].max_skew, 1);
        assert_eq!(
            spread[0].label_selector.as_ref().unwrap().match_labels,
            Some(selector_labels(&fixtures::route(fixtures::full_spec()))),
            "a constraint without a selector spreads this route's pods"
        );
    }

    #[test]
    fn a_topology_spread_constraint_keeps_its_own_label_selector() {
        let mut spec = fixtures::full_spec();
        spec.gateway.topology_spread_constraints = Some(
            serde_json::from_value(serde_json::json!([{
                "maxSkew": 2, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"tier": "realtime"}}
            }]))
            .unwrap(),
        );
        let d = build(spec);
        let spread = pod(&d).topology_spread_constraints.clone().unwrap();
        assert_eq!(
            spread[0].label_selector.as_ref().unwrap().match_labels,
            Some(BTreeMap::from([(
                "tier".to_string(),
                "realtime".to_string()
            )]))
        );
    }

    #[test]
    fn pod_labels_never_replace_the_selector_labels() {
        // Validation refuses such a route; the builder keeps the selector even so.
        let mut spec = fixtures::full_spec();
        for key in crate::crd::OPERATOR_POD_LABELS {
            spec.gateway.pod_labels.insert(key.into(), "hijack".into());
        }
        spec.gateway
            .pod_annotations
            .insert(CONFIG_HASH_ANNOTATION.into(), "stale".into());
        let route = fixtures::route(spec);
        let d = deployment(&route, "img", "abc");
        let template = &d.spec.as_ref().unwrap().template;
        let labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (k, v) in super::labels(&route) {
            assert_eq!(labels[&k], v, "{k}");
        }
        let selector = d
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .clone()
            .unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
        let annotations = template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION], "abc");
    }

    #[test]
    fn a_route_without_pod_overrides_renders_none_of_them() {
        let d = build(fixtures::minimal_spec());
        let pod = pod(&d);
        assert_eq!(pod.image_pull_secrets, None);
        assert_eq!(pod.priority_class_name, None);
        assert_eq!(pod.topology_spread_constraints, None);
        assert_eq!(gateway(&d).image_pull_policy, None);
        let meta = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap();
        assert_eq!(
            meta.annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            [CONFIG_HASH_ANNOTATION]
        );
    }

    #[test]
    fn the_operator_default_image_is_used_when_the_route_names_none() {
        let d = build(fixtures::minimal_spec());
        assert_eq!(gateway(&d).image.as_deref(), Some("patchbay/gateway:test"));
        assert!(
            pod(&d)
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .all(|v| v.name != "redis-url"),
            "no Redis volume without a Redis secret"
        );
    }

    #[test]
    fn the_pod_template_carries_the_config_hash_and_the_labels() {
        let d = build(fixtures::minimal_spec());
        let meta = d.spec.as_ref().unwrap().template.metadata.as_ref().unwrap();
        assert_eq!(
            meta.annotations.as_ref().unwrap()[CONFIG_HASH_ANNOTATION],
            "abc"
        );
        let labels = meta.labels.as_ref().unwrap();
        let selector = d
            .spec
            .as_ref()
            .unwrap()
            .selector
            .match_labels
            .as_ref()
            .unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
    }
}
