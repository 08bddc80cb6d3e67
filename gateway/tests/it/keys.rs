//! Client keys from a keys file: hashed entries, per-key session caps,
//! disabled keys, and live reloads.

use crate::common::*;
use patchbay_sim::SimConfig;

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
    let gw = keys_file_gateway(&sim, &file).await;
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
    let gw = keys_file_gateway(&sim, &file).await;
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

const MINI: &str = "gpt-realtime-mini";

/// 101 when a session on `model` opens with `key` (after its
/// `session.created`), else the refusal's status and body.
async fn open_model(
    addr: std::net::SocketAddr,
    key: &str,
    model: &str,
) -> Result<Client, (u16, serde_json::Value)> {
    let bearer = format!("Bearer {key}");
    let q = format!("?model={model}");
    match connect_with(addr, &q, &[("authorization", &bearer)]).await {
        Ok((mut ws, _)) => {
            assert_eq!(kind(&recv_text(&mut ws).await), "session.created");
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = r.body().clone().unwrap_or_default();
            let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            Err((r.status().as_u16(), json))
        }
        Err(e) => panic!("{e}"),
    }
}

fn upgrades(sim: &patchbay_sim::SimHandle) -> u64 {
    sim.stats.upgrades.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn model_allow_lists_admit_listed_models_and_refuse_others_with_403_before_any_dial() {
    let sim = sim(SimConfig::default()).await;
    // `only-gpt-realtime` also has rpm = 1 and max_sessions = 1: refusals
    // for another model must consume neither.
    let keys = key_entry(
        "only-gpt-realtime",
        "pb-one",
        "models = [\"gpt-realtime\"]\nrpm = 1\nmax_sessions = 1",
    ) + &key_entry(
        "both-in-mini-team",
        "pb-both",
        "team = \"mini-team\"\nmodels = [\"gpt-realtime\", \"gpt-realtime-mini\"]",
    ) + &key_entry("team-list-only", "pb-team", "team = \"mini-team\"")
        + &key_entry("no-models", "pb-none", "models = []")
        + "[[teams]]\nid = \"mini-team\"\nmodels = [\"gpt-realtime-mini\"]\n";
    let file = TempFile::new("keys.toml", &keys);
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!(
            "[[routes]]\nmodel = \"{MINI}\"\nupstream_url = \"{}\"\napi_key_env = \"SIM_KEY\"\n\
             [keys]\nfile = \"{}\"\n",
            sim.url(false),
            file.0.display()
        ),
    ))
    .await;

    let mut refusals = 0;
    let mut expect_403 = async |key: &str, model: &str| {
        let before = upgrades(&sim);
        let (status, body) = open_model(gw.addr, key, model)
            .await
            .err()
            .unwrap_or_else(|| panic!("{key} on {model} was admitted"));
        assert_eq!(status, 403, "{key} on {model}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "model_not_allowed");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("'{model}'")), "{message}");
        assert!(
            !message.contains(key) && !message.contains("only-gpt") && !message.contains("team"),
            "the message names neither the key nor its id: {message}"
        );
        assert_eq!(
            upgrades(&sim),
            before,
            "nothing was dialled for {key} on {model}"
        );
        refusals += 1;
    };
    for _ in 0..3 {
        expect_403("pb-one", MINI).await;
    }
    // Team intersection: the key lists both, its team only the mini.
    expect_403("pb-both", MODEL).await;
    expect_403("pb-team", MODEL).await;
    // An empty list allows nothing.
    expect_403("pb-none", MODEL).await;
    expect_403("pb-none", MINI).await;

    // Allowed models open sessions (dialling the upstream); the refusals
    // above took neither the rpm nor the session slot of `pb-one`.
    let before = upgrades(&sim);
    let _one = open_model(gw.addr, "pb-one", MODEL).await.unwrap();
    let _both = open_model(gw.addr, "pb-both", MINI).await.unwrap();
    let _team = open_model(gw.addr, "pb-team", MINI).await.unwrap();
    let _master = open_model(gw.addr, CLIENT_KEY, MINI).await.unwrap();
    assert_eq!(upgrades(&sim), before + 4);
    let counted = metric(
        gw.admin_addr,
        "patchbay_admission_refusals_total",
        "reason=\"model_not_allowed\"",
    )
    .await;
    assert_eq!(counted, f64::from(refusals));
}

/// An emptied keys file (a botched render, a Secret mounted empty) would
/// revoke every key at once: it is refused, and the live session carries
/// on. A file that says `allow_empty = true` empties the set on purpose.
#[tokio::test]
async fn an_empty_keys_file_is_refused_and_does_not_revoke_a_live_session() {
    let sim = sim(SimConfig::default()).await;
    let file = TempFile::new("keys.toml", &key_entry("a", "pb-a", ""));
    let gw = keys_file_gateway(&sim, &file).await;
    let mut ws = open_with(gw.addr, "pb-a").await.unwrap();
    one_turn(&mut ws).await;
    // The watcher's first read (what was loaded at start) is applied.
    assert!(eventually(|| reloads(&gw, "keys", "applied") == 1).await);

    std::fs::write(&file.0, "").unwrap();
    assert!(
        eventually(|| reloads(&gw, "keys", "rejected") == 1).await,
        "the empty keys file was not refused"
    );
    let turn = one_turn(&mut ws).await;
    assert_eq!(kind(turn.last().unwrap()), "response.done", "still live");
    assert_eq!(status_for(gw.addr, "pb-a").await, 101);

    std::fs::write(&file.0, "allow_empty = true\n").unwrap();
    assert!(eventually(|| reloads(&gw, "keys", "applied") == 2).await);
    let (_, code, _) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008), "the key was revoked on purpose");
    assert_eq!(status_for(gw.addr, "pb-a").await, 401);
}
