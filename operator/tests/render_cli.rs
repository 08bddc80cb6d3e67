//! `patchbay-operator render -f FILE`, run as a user would: the examples render offline to the
//! objects the operator applies, and a file it cannot render exits 2 saying why.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::apps::v1::Deployment;
use serde::Deserialize;

fn example(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file)
}

/// Runs `patchbay-operator render ARGS` with no cluster configuration at all: no kubeconfig, no
/// in-cluster variables, so any attempt to reach an API server would fail.
fn render(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_patchbay-operator"))
        .arg("render")
        .args(args)
        .env_remove("PATCHBAY_GATEWAY_IMAGE")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdin(Stdio::null())
        .output()
        .expect("run patchbay-operator render")
}

fn docs(stdout: &[u8]) -> Vec<serde_yaml::Value> {
    let text = std::str::from_utf8(stdout).expect("UTF-8 output");
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_yaml::Value::deserialize(d).expect("a YAML document"))
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn the_quickstart_example_renders_every_child_offline() {
    let path = example("realtimeroute.yaml");
    let out = render(&["-f", path.to_str().unwrap(), "-n", "voice"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = docs(&out.stdout);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "ConfigMap",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Deployment",
            "Service",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget"
        ]
    );
    for d in &docs {
        assert_eq!(d["metadata"]["namespace"], "voice", "{d:?}");
        assert!(d["apiVersion"].as_str().is_some(), "{d:?}");
    }
    // The Deployment decodes as one, with the operator's default image.
    let deployment: Deployment = serde_yaml::from_value(docs[5].clone()).expect("a Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("patchbay/gateway:0.1.0")
    );
}

#[test]
fn every_example_renders_and_stdin_works_too() {
    for file in [
        "realtimeroute-minimal.yaml",
        "realtimeroute-full.yaml",
        "realtimeroute-upstreams.yaml",
    ] {
        let path = example(file);
        let out = render(&["-f", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(docs(&out.stdout).len() >= 5, "{file}");
    }
    let text = std::fs::read(example("realtimeroute-minimal.yaml")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_patchbay-operator"))
        .args([
            "render",
            "-f",
            "-",
            "--gateway-image",
            "registry.example/gw:1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("image: registry.example/gw:1"), "{stdout}");
    assert!(stdout.contains("namespace: default"), "{stdout}");
}

#[test]
fn a_file_it_cannot_render_exits_2_with_the_reason() {
    let dir = std::env::temp_dir().join(format!("patchbay-render-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let route = std::fs::read_to_string(example("realtimeroute-minimal.yaml")).unwrap();
    let cases = [
        ("broken.yaml", "spec: [".to_string(), "not YAML"),
        (
            "secrets-only.yaml",
            std::fs::read_to_string(example("secrets.yaml")).unwrap(),
            "no RealtimeRoute",
        ),
        (
            "no-spec.yaml",
            "apiVersion: patchbay.dev/v1alpha1\nkind: RealtimeRoute\nmetadata: {name: x}\n"
                .to_string(),
            "not a valid RealtimeRoute",
        ),
        (
            "blank-model.yaml",
            route.replace("model: gpt-realtime", "model: \" \""),
            "invalid spec: model \" \" is blank",
        ),
    ];
    for (name, text, expected) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = render(&["-f", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        assert!(
            stderr.contains(&format!("patchbay-operator render: {}", path.display())),
            "{name}: {stderr}"
        );
        assert!(stderr.contains(expected), "{name}: {stderr}");
    }
    let missing = dir.join("missing.yaml");
    let out = render(&["-f", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}
