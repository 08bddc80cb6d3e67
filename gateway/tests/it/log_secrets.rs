//! No secret in any log line, at any level: the real binary at
//! `RUST_LOG=trace`, in both log formats, mints a client secret, serves a
//! pooled session (a key from the keys file) and a freshly dialled one (the
//! minted secret), and refuses a key; neither the upstream key nor any
//! client credential appears in anything it writes (stderr or stdout).

use std::io::Read;
use std::time::Duration;

use crate::common::*;
use patchbay_sim::SimConfig;

/// A client key the gateway does not know.
const REFUSED_KEY: &str = "pb-refused-3c9e71d0a2";
/// A second client key, from the keys file.
const FILE_KEY: &str = "pb-file-68f0c1d2e3a4b5c6d7e8f9a0";

/// Runs the scenario at `RUST_LOG=trace` in `format`; returns (stderr,
/// stdout, the minted client secret).
async fn trace_everything(format: &str) -> (String, String, String) {
    let sim = sim(SimConfig {
        // Slow upgrades: the pool refills long after the second session
        // asked, so that session dials fresh.
        upgrade_delay: Duration::from_millis(1000),
        ..SimConfig::default()
    })
    .await;
    let keys = TempFile::new("keys.toml", &key_entry("file", FILE_KEY, ""));
    let mut child = Child::start(
        &sim.url(false),
        &format!(
            "[keys]\nfile = \"{}\"\n[pool]\nsize = 1\n",
            keys.0.display()
        ),
        &[("RUST_LOG", "trace"), ("PATCHBAY_LOG_FORMAT", format)],
    )
    .await;

    let (status, _, body) = crate::client_secrets::mint_with(
        child.addr,
        CLIENT_KEY,
        serde_json::json!({"session": {"type": "realtime", "model": MODEL, "instructions": "x"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let minted = body["value"].as_str().unwrap().to_string();
    let mut pooled = open_with(child.addr, FILE_KEY).await.expect("a session");
    let mut fresh = open_with(child.addr, &minted).await.expect("a session");
    // The minted config is confirmed before the client's frames go on.
    assert_eq!(kind(&recv_text(&mut fresh).await), "session.updated");
    for ws in [&mut pooled, &mut fresh] {
        assert_eq!(kind(one_turn(ws).await.last().unwrap()), "response.done");
    }
    assert_eq!(
        metric(child.admin_addr, "patchbay_pool_hits_total", "").await,
        1.0,
        "one session through the pool"
    );
    assert_eq!(
        metric(child.admin_addr, "patchbay_pool_misses_total", "").await,
        1.0,
        "one fresh dial"
    );
    let bearer = format!("Bearer {REFUSED_KEY}");
    let (status, _, _) = refused(
        child.addr,
        &format!("?model={MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 401);

    child.sigterm();
    assert_eq!(child.wait_exit(WAIT).await.0, Some(0));
    // The drain's last line is written before the exit; the reader thread
    // may still be collecting it.
    assert!(
        eventually(|| child.logs().contains("drained")).await,
        "the log ends with the drain:\n{}",
        child.logs()
    );
    let mut stdout = String::new();
    child
        .process
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    (child.logs(), stdout, minted)
}

fn assert_no_secret(what: &str, text: &str, minted: &str) {
    for secret in [UPSTREAM_KEY, CLIENT_KEY, FILE_KEY, REFUSED_KEY, minted] {
        if let Some(at) = text.find(secret) {
            let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
            panic!("{secret} appears on {what}: {}", &text[start..end]);
        }
    }
}

#[tokio::test]
async fn no_key_or_client_secret_is_logged_at_trace_in_text_or_json() {
    for format in ["text", "json"] {
        let (stderr, stdout, minted) = trace_everything(format).await;
        // The level really was trace for the gateway: its debug lines are there.
        assert!(
            stderr.contains("listening for signals"),
            "{format}:\n{stderr}"
        );
        assert_eq!(
            stdout.lines().count(),
            2,
            "one request-log row per turn ({format}):\n{stdout}"
        );
        assert!(minted.starts_with("pbek_"), "{minted}");
        assert_no_secret(&format!("stderr ({format})"), &stderr, &minted);
        // stderr is a pipe here, as under a log collector: no colour codes.
        assert!(
            !stderr.contains('\x1b'),
            "ANSI escapes in {format}:\n{stderr}"
        );
        assert_no_secret(&format!("stdout ({format})"), &stdout, &minted);
    }
}
