//! The binary's commands besides `serve`: `check` (exit 0 and what would be
//! served, or exit 2 naming the key), `print-config` (the effective config,
//! never a secret set through the environment) and `keys new` (a key the
//! printed digest is of, and that the gateway then accepts).

use std::process::Output;

use crate::common::*;
use patchbay_gateway::auth::KeySet;
use patchbay_gateway::secret::Secret;
use patchbay_sim::SimConfig;

/// The upstream key, set through the environment.
const UPSTREAM_SECRET: &str = "sk-cli-upstream-5e4d3c";
/// The Redis URL's password, set through the environment.
const REDIS_PASSWORD: &str = "hunter2-cli-7f6e";
/// The master key, set through the environment.
const MASTER_SECRET: &str = "pb-cli-master-1a2b3c";

/// Runs the binary with `args` and `env` (and nothing of the test's own
/// `PATCHBAY_*` environment), from the temp directory (no `patchbay.toml`).
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_patchbay-gateway"));
    cmd.args(args)
        .current_dir(std::env::temp_dir())
        .env("RUST_LOG", "warn");
    for (k, _) in std::env::vars() {
        if k.starts_with("PATCHBAY_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn config_file(extra: &str) -> TempFile {
    TempFile::new(
        "gateway.toml",
        &format!(
            "[[routes]]\nmodel = \"{MODEL}\"\nupstream_url = \"wss://upstream.example/v1/realtime\"\n\
             api_key_env = \"CLI_UPSTREAM_KEY\"\n{extra}"
        ),
    )
}

#[test]
fn check_prints_what_would_be_served_and_exits_0() {
    let keys = TempFile::new("keys.toml", &key_entry("svc", "pb-cli-svc", ""));
    let config = config_file(&format!("[keys]\nfile = \"{}\"\n", keys.0.display()));
    let out = run(
        &["check", "--config", config.0.to_str().unwrap()],
        &[("CLI_UPSTREAM_KEY", UPSTREAM_SECRET)],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&format!("route {MODEL}")), "{stdout}");
    assert!(stdout.contains("upstream.example"), "{stdout}");
    assert!(stdout.contains("client keys: 1"), "{stdout}");
    assert!(stdout.contains("store: memory"), "{stdout}");
    assert!(!stdout.contains(UPSTREAM_SECRET), "{stdout}");
}

#[test]
fn check_of_a_bad_config_exits_2_naming_the_key() {
    let config = config_file("[server]\nupgrade_timeout_secs = \"ten\"\n");
    let out = run(
        &["check", "--config", config.0.to_str().unwrap()],
        &[("CLI_UPSTREAM_KEY", UPSTREAM_SECRET)],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("server.upgrade_timeout_secs"), "{stderr}");

    // A keys file is loaded as `serve` loads it: its fault is named too.
    let keys = TempFile::new("keys.toml", "[[keys]]\nid = \"svc\"\nsha256 = \"nope\"\n");
    let config = config_file(&format!("[keys]\nfile = \"{}\"\n", keys.0.display()));
    let out = run(
        &["check", "--config", config.0.to_str().unwrap()],
        &[("CLI_UPSTREAM_KEY", UPSTREAM_SECRET)],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("keys[0].sha256"), "{stderr}");
}

#[test]
fn print_config_shows_overrides_and_never_a_secret_set_through_the_environment() {
    let config = config_file("[store]\nredis_url_env = \"CLI_REDIS_URL\"\n");
    let redis_url = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:1");
    let out = run(
        &["print-config", "--config", config.0.to_str().unwrap()],
        &[
            ("CLI_UPSTREAM_KEY", UPSTREAM_SECRET),
            ("CLI_REDIS_URL", &redis_url),
            ("PATCHBAY_MASTER_KEY", MASTER_SECRET),
            ("PATCHBAY_SERVER_UPGRADE_TIMEOUT_SECS", "7"),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let doc: toml::Table = toml::from_str(&stdout).expect("TOML");
    assert_eq!(doc["server"]["upgrade_timeout_secs"].as_integer(), Some(7));
    assert_eq!(
        doc["store"]["redis_url_env"].as_str(),
        Some("CLI_REDIS_URL")
    );
    for secret in [UPSTREAM_SECRET, REDIS_PASSWORD, MASTER_SECRET] {
        assert!(!stdout.contains(secret), "{secret} printed:\n{stdout}");
        assert!(!text(&out.stderr).contains(secret), "{secret} on stderr");
    }
}

#[tokio::test]
async fn keys_new_prints_a_key_its_digest_is_of_and_the_gateway_accepts_it() {
    let out = run(&["keys", "new", "--id", "svc-new", "--team", "voice"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let (key, block) = stdout.split_once("\n\n").expect("the key, then the block");
    assert!(key.starts_with("pb-") && key.len() > 40, "{key}");
    let entry: toml::Table = toml::from_str(block).expect("TOML");
    let digest = entry["keys"][0]["sha256"].as_str().unwrap();
    assert_eq!(digest, hex::encode(Secret::new(key).sha256()));
    let set = KeySet::parse(block).expect("a keys file");
    let found = set.lookup(&Secret::new(key)).expect("the key is found");
    assert_eq!(found.id, "svc-new");
    assert_eq!(found.team.as_deref(), Some("voice"));
    // A second key is another key.
    let again = text(&run(&["keys", "new", "--id", "x"], &[]).stdout);
    assert_ne!(again.lines().next(), Some(key));

    let sim = sim(SimConfig::default()).await;
    let keys = TempFile::new("keys.toml", block);
    let child = Child::start(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n", keys.0.display()),
        &[],
    )
    .await;
    let mut ws = open_with(child.addr, key)
        .await
        .expect("the new key is accepted");
    assert_eq!(
        kind(one_turn(&mut ws).await.last().unwrap()),
        "response.done"
    );
}

#[test]
fn a_misspelt_env_override_stops_serve_and_check_with_exit_2_naming_it() {
    let config = config_file("");
    let path = config.0.to_str().unwrap();
    let env = [
        ("CLI_UPSTREAM_KEY", UPSTREAM_SECRET),
        ("PATCHBAY_RELAY_IDLE_TIMEOUT_SEC", "60"),
    ];
    // `--config` without a command is `serve --config`.
    for args in [&["--config", path][..], &["check", "--config", path]] {
        let out = run(args, &env);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("PATCHBAY_RELAY_IDLE_TIMEOUT_SEC")
                && stderr.contains("did you mean PATCHBAY_RELAY_IDLE_TIMEOUT_SECS?"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn an_unknown_patchbay_variable_outside_the_sections_is_a_warning() {
    let config = config_file("");
    let out = run(
        &["check", "--config", config.0.to_str().unwrap()],
        &[
            ("CLI_UPSTREAM_KEY", UPSTREAM_SECRET),
            ("PATCHBAY_WATCH_NAMESPACE", "voice"),
            ("PATCHBAY_MASTER_KEY", MASTER_SECRET),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "warning: the environment sets PATCHBAY_WATCH_NAMESPACE, which the gateway does not read"
        ),
        "{stdout}"
    );
}

#[test]
fn relative_paths_in_a_config_file_resolve_against_its_directory() {
    let dir = std::env::temp_dir().join(format!(
        "patchbay-test-{}-{}-rel",
        std::process::id(),
        patchbay_gateway::ids::short_id()
    ));
    std::fs::create_dir_all(dir.join("secrets")).unwrap();
    std::fs::write(dir.join("keys.toml"), key_entry("svc", "pb-cli-rel", "")).unwrap();
    std::fs::write(dir.join("secrets/upstream"), UPSTREAM_SECRET).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[[routes]]\nmodel = \"{MODEL}\"\nupstream_url = \"wss://upstream.example/v1/realtime\"\n\
             api_key_file = \"secrets/upstream\"\n[keys]\nfile = \"keys.toml\"\n"
        ),
    )
    .unwrap();
    // Run from elsewhere (the temp directory's parent of `dir`).
    let out = run(&["check", "--config", config.to_str().unwrap()], &[]);
    let stdout = text(&out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("client keys: 1"), "{stdout}");
    assert!(
        stdout.contains(&format!("(from {})", dir.join("keys.toml").display())),
        "{stdout}"
    );
}

#[test]
fn a_keys_file_type_error_names_the_entry() {
    let keys = TempFile::new(
        "keys.toml",
        &format!("{}rpm = \"sixty\"\n", key_entry("svc", "pb-cli-rpm", "")),
    );
    let config = config_file(&format!("[keys]\nfile = \"{}\"\n", keys.0.display()));
    let out = run(
        &["check", "--config", config.0.to_str().unwrap()],
        &[("CLI_UPSTREAM_KEY", UPSTREAM_SECRET)],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("keys[0].rpm"), "{stderr}");
}

#[test]
fn the_demo_runs_its_sessions_and_says_where_it_listens_when_the_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = run(
        &[
            "demo",
            "--once",
            "--sessions",
            "2",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let moved = stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "127.0.0.1:{port} is taken: the demo gateway listens on "
            ))
        })
        .and_then(|l| l.strip_suffix(" instead"))
        .unwrap_or_else(|| panic!("the new address is printed:\n{stdout}"));
    assert!(
        stdout.contains(&format!("gateway:            ws://{moved}/v1/realtime")),
        "{stdout}"
    );
    // One request-log row per session's turn, each billed.
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(
        rows.iter().all(|r| r["cost_usd"].as_f64() > Some(0.0)),
        "{stdout}"
    );
    assert!(stdout.contains("response.done"), "{stdout}");
}

#[test]
fn the_example_config_for_the_simulator_checks_as_documented() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/gateway-sim.toml");
    let out = run(
        &["check", "--config", example],
        &[
            ("SIM_UPSTREAM_KEY", "sk-sim"),
            ("PATCHBAY_MASTER_KEY", "pb-local-key"),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("listen: 127.0.0.1:8080 (admin 127.0.0.1:9090)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("upstream gpt-realtime: 127.0.0.1"),
        "{stdout}"
    );
}
