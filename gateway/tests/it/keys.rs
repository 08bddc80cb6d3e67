//! Client keys from a keys file: hashed entries, per-key session caps,
//! disabled keys, and live reloads.

use crate::common::*;
use patchbay_gateway::sim::SimConfig;

/// 101 when a session opens with `key`, else the refusal's status.
async fn status_for(addr: std::net::SocketAddr, key: &str) -> u16 {
    open_with(addr, key).await.err().unwrap_or(101)
}

#[tokio::test]
async fn keys_file_entries_authenticate_and_reload_live() {
    let sim = sim(SimConfig::default()).await;
    let file = TempFile::new(
        "keys.toml",
        &(key_entry("a", "pb-a", "") + &key_entry("b", "pb-b", "disabled = true")),
    );
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n", file.0.display()),
    ))
    .await;
    assert_eq!(status_for(gw.addr, "pb-a").await, 101);
    assert_eq!(
        status_for(gw.addr, "pb-b").await,
        401,
        "a disabled key is refused"
    );
    assert_eq!(status_for(gw.addr, "pb-c").await, 401);
    assert_eq!(
        status_for(gw.addr, CLIENT_KEY).await,
        101,
        "the master key still works"
    );

    std::fs::write(&file.0, key_entry("c", "pb-c", "")).unwrap();
    assert!(eventually(|| gw.gateway.keys.get().by_id("c").is_some()).await);
    assert_eq!(status_for(gw.addr, "pb-c").await, 101);
    assert_eq!(
        status_for(gw.addr, "pb-a").await,
        401,
        "a removed key is refused"
    );

    // A broken file keeps the keys that were loaded, once the watcher has
    // read and refused it.
    assert_eq!(reloads(&gw, "keys", "rejected"), 0);
    std::fs::write(&file.0, "[[keys]]\nid = 1\n").unwrap();
    assert!(
        eventually(|| reloads(&gw, "keys", "rejected") == 1).await,
        "the watcher never refused the broken keys file"
    );
    assert_eq!(status_for(gw.addr, "pb-c").await, 101);
}

#[tokio::test]
async fn per_key_session_cap_is_enforced_with_429() {
    let sim = sim(SimConfig::default()).await;
    let file = TempFile::new("keys.toml", &key_entry("a", "pb-a", "max_sessions = 1"));
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!("[keys]\nfile = \"{}\"\n", file.0.display()),
    ))
    .await;
    let bearer = "Bearer pb-a".to_string();
    let q = format!("?model={MODEL}");
    let (mut first, _) = connect_with(gw.addr, &q, &[("authorization", &bearer)])
        .await
        .unwrap();
    recv_text(&mut first).await;
    let (status, _, body) = refused(gw.addr, &q, &[("authorization", &bearer)]).await;
    assert_eq!(status, 429);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("key 'a'"));
    // Other keys are not affected.
    assert_eq!(status_for(gw.addr, CLIENT_KEY).await, 101);
    drop(first);
    assert!(eventually(|| gw.gateway.sessions.key_active("a") == 0).await);
    assert_eq!(status_for(gw.addr, "pb-a").await, 101);
}
