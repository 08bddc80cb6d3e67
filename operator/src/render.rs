//! `patchbay-operator render`: the children the operator would apply for the routes in a file,
//! as YAML, without an API server.
//!
//! The same stages as a reconcile, minus the I/O: each `RealtimeRoute` document is decoded as the
//! controller decodes what the API server stored, checked by [`crate::validate::check_route`]
//! (the schema's CEL rules are not evaluated here; the operator's validation repeats them), and
//! built by [`crate::build::desired`]. What a live reconcile would know and a file does not is
//! filled in plainly: the namespace is the document's or the `--namespace` given; the replica
//! count to size pools for is `replicas.min` (a Deployment that does not exist yet); and a route
//! read from a file has no `uid`, so the children carry no `ownerReferences` (the operator adds
//! them when it applies). Documents of other kinds (the Secrets of `examples/secrets.yaml`, say)
//! are skipped, so a file that creates a route's Secrets beside it renders too.

use kube::Resource;
use serde::Deserialize;

use crate::build::{desired, BuildInput, Desired};
use crate::crd::{RealtimeRoute, GROUP};

/// Why a file cannot be rendered: each says which document and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("document {doc}: not YAML: {source}")]
    Yaml {
        doc: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("document {doc}: not a valid RealtimeRoute: {source}")]
    NotARoute {
        doc: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("document {doc}: RealtimeRoute of apiVersion {found:?}: this operator serves {GROUP}/v1alpha1")]
    UnknownVersion { doc: usize, found: String },
    #[error("document {doc}: a RealtimeRoute needs metadata.name")]
    Unnamed { doc: usize },
    #[error("document {doc}: RealtimeRoute {name}: {source}")]
    Invalid {
        doc: usize,
        name: String,
        #[source]
        source: crate::Error,
    },
    #[error("no RealtimeRoute ({GROUP}/v1alpha1) in the file")]
    NoRoute,
}

/// What a render needs besides the file.
#[derive(Clone, Debug)]
pub struct RenderInput<'a> {
    /// The namespace of a route whose document names none.
    pub namespace: &'a str,
    /// The gateway image of a route that names none (the operator's `--gateway-image`).
    pub default_image: &'a str,
}

/// The children of every route in `text` (one or more YAML documents), as YAML documents in the
/// order the operator applies them, each route's preceded by a comment naming it.
pub fn render(text: &str, input: &RenderInput<'_>) -> Result<String, RenderError> {
    let mut out = String::new();
    let mut routes = 0;
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let doc = i + 1;
        let value = serde_yaml::Value::deserialize(document)
            .map_err(|source| RenderError::Yaml { doc, source })?;
        if value.is_null() || !is_route(&value) {
            continue;
        }
        let version = value["apiVersion"].as_str().unwrap_or_default();
        if version != RealtimeRoute::api_version(&()) {
            return Err(RenderError::UnknownVersion {
                doc,
                found: version.to_string(),
            });
        }
        let mut route: RealtimeRoute = serde_yaml::from_value(value)
            .map_err(|source| RenderError::NotARoute { doc, source })?;
        let Some(name) = route.metadata.name.clone() else {
            return Err(RenderError::Unnamed { doc });
        };
        route
            .metadata
            .namespace
            .get_or_insert_with(|| input.namespace.to_string());
        crate::validate::check_route(&route).map_err(|source| RenderError::Invalid {
            doc,
            name: name.clone(),
            source,
        })?;
        let children = desired(&BuildInput {
            route: &route,
            default_image: input.default_image,
            observed_replicas: None,
        });
        let namespace = route.metadata.namespace.as_deref().unwrap_or_default();
        out.push_str(&format!(
            "# RealtimeRoute {namespace}/{name}: the children the operator applies, in order \
             (ownerReferences are added when applied)\n"
        ));
        out.push_str(&children_yaml(children));
        routes += 1;
    }
    if routes == 0 {
        return Err(RenderError::NoRoute);
    }
    Ok(out)
}

/// `kind: RealtimeRoute` of this API group, in any version: one this operator does not serve is
/// refused by name rather than skipped in silence.
fn is_route(doc: &serde_yaml::Value) -> bool {
    let group_matches = doc["apiVersion"]
        .as_str()
        .is_some_and(|v| v.split('/').next() == Some(GROUP));
    doc["kind"] == "RealtimeRoute" && group_matches
}

/// Every child as a YAML document, in apply order. Destructured without `..`, as the apply stage
/// does, so a new kind of child does not compile until it is rendered here too.
fn children_yaml(children: Desired) -> String {
    let Desired {
        gateway_config,
        pool_config,
        service_account,
        pool_reader_role,
        pool_reader_binding,
        deployment,
        service,
        hpa,
        pdb,
        http_route,
        pool_size: _,
        config_hash: _,
    } = children;
    let mut docs = vec![
        yaml(&gateway_config),
        yaml(&pool_config),
        yaml(&service_account),
        yaml(&pool_reader_role),
        yaml(&pool_reader_binding),
        yaml(&deployment),
        yaml(&service),
    ];
    match hpa {
        Some(hpa) => docs.push(yaml(&hpa)),
        None => docs.push(
            "# no HorizontalPodAutoscaler: replicas.min == replicas.max (an existing one is \
             deleted)\n"
                .to_string(),
        ),
    }
    docs.push(yaml(&pdb));
    if let Some(http_route) = http_route {
        docs.push(yaml(&http_route));
    }
    docs.iter().map(|d| format!("---\n{d}")).collect()
}

fn yaml<T: serde::Serialize>(object: &T) -> String {
    // A k8s-openapi object always serialises.
    serde_yaml::to_string(object).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INPUT: RenderInput<'static> = RenderInput {
        namespace: "voice",
        default_image: "patchbay/gateway:test",
    };

    const ROUTE: &str = "apiVersion: patchbay.dev/v1alpha1
kind: RealtimeRoute
metadata: {name: voice}
spec:
  model: gpt-realtime
  upstream: {apiKeySecretRef: {name: openai, key: api-key}}
  replicas: {min: 2, max: 4}
  peakConcurrency: 10
  clientKeysSecretRef: {name: voice-keys, key: keys.toml}
";

    fn kinds_and_names(out: &str) -> Vec<(String, String)> {
        serde_yaml::Deserializer::from_str(out)
            .map(|d| serde_yaml::Value::deserialize(d).unwrap())
            .filter(|d| !d.is_null())
            .map(|d| {
                (
                    d["kind"].as_str().unwrap().to_string(),
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn every_child_is_printed_in_apply_order_in_the_routes_namespace() {
        let out = render(ROUTE, &INPUT).unwrap();
        assert_eq!(
            kinds_and_names(&out),
            [
                ("ConfigMap", "voice-gateway"),
                ("ConfigMap", "voice-pool"),
                ("ServiceAccount", "voice-gateway"),
                ("Role", "voice-gateway-pool"),
                ("RoleBinding", "voice-gateway-pool"),
                ("Deployment", "voice-gateway"),
                ("Service", "voice"),
                ("HorizontalPodAutoscaler", "voice-gateway"),
                ("PodDisruptionBudget", "voice-gateway"),
            ]
            .map(|(k, n)| (k.to_string(), n.to_string()))
        );
        for doc in serde_yaml::Deserializer::from_str(&out) {
            let doc = serde_yaml::Value::deserialize(doc).unwrap();
            assert_eq!(doc["metadata"]["namespace"], "voice");
            assert!(doc["metadata"].get("ownerReferences").is_none());
        }
        // The pool is sized for replicas.min: ceil(10 / 2).
        assert!(out.contains("REALTIME_POOL_SIZE: '5'"), "{out}");
        assert!(out.contains("image: patchbay/gateway:test"), "{out}");
    }

    #[test]
    fn a_fixed_count_route_has_no_hpa_and_says_so() {
        let fixed = ROUTE.replace("{min: 2, max: 4}", "{min: 2, max: 2}");
        let out = render(&fixed, &INPUT).unwrap();
        assert!(!kinds_and_names(&out)
            .iter()
            .any(|(k, _)| k == "HorizontalPodAutoscaler"));
        assert!(out.contains("# no HorizontalPodAutoscaler"));
    }

    #[test]
    fn other_kinds_are_skipped_and_each_route_is_rendered() {
        let text = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: openai}}\n---\n{ROUTE}---\n{}",
            ROUTE.replace("name: voice}", "name: other, namespace: elsewhere}")
        );
        let out = render(&text, &INPUT).unwrap();
        let names = kinds_and_names(&out);
        assert_eq!(names.len(), 18);
        assert!(names.contains(&("Service".into(), "other".into())));
        assert!(out.contains("namespace: elsewhere"));
    }

    #[test]
    fn a_file_that_cannot_be_rendered_says_which_document_and_why() {
        let cases = [
            ("kind: [unclosed", "document 1: not YAML"),
            (
                "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
                "no RealtimeRoute",
            ),
            (
                "apiVersion: patchbay.dev/v1alpha1\nkind: RealtimeRoute\nmetadata: {name: v}\nspec: {model: m}\n",
                "document 1: not a valid RealtimeRoute",
            ),
            (
                &ROUTE.replace("metadata: {name: voice}", "metadata: {}"),
                "document 1: a RealtimeRoute needs metadata.name",
            ),
            (
                &ROUTE.replace("peakConcurrency: 10", "metering: {prices: [{model: m, textInput: 2e6, cachedTextInput: 0, audioInput: 0, cachedAudioInput: 0, textOutput: 0, audioOutput: 0}]}"),
                "document 1: RealtimeRoute voice: invalid spec: metering.prices[0].textInput",
            ),
            (
                &ROUTE.replace("patchbay.dev/v1alpha1", "patchbay.dev/v2"),
                "document 1: RealtimeRoute of apiVersion \"patchbay.dev/v2\": this operator serves patchbay.dev/v1alpha1",
            ),
            (
                &format!("---\n{}", ROUTE.replace("name: voice}", "name: Voice}")),
                "document 1: RealtimeRoute Voice: invalid spec: metadata.name",
            ),
        ];
        for (text, expected) in cases {
            let err = render(text, &INPUT).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }
}
