//! The committed `crds/realtimeroute.yaml` is exactly what `patchbay-operator crd` prints.

use std::path::PathBuf;

fn committed_crd_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../crds/realtimeroute.yaml")
}

#[test]
fn the_committed_crd_equals_the_generated_one() {
    let path = committed_crd_path();
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let generated = patchbay_operator::crd::crd_yaml();
    assert!(
        committed == generated,
        "{} is stale; regenerate it with\n  cargo run -p patchbay-operator -- crd > crds/realtimeroute.yaml",
        path.display()
    );
}

#[test]
fn the_crd_subcommand_prints_the_generated_crd() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_patchbay-operator"))
        .arg("crd")
        .output()
        .expect("run patchbay-operator crd");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        patchbay_operator::crd::crd_yaml()
    );
}
