//! Managed Redis over TLS: a real `redis-server` with a TLS port only, a
//! certificate from a test CA, and an ACL user, in front of a real gateway
//! and the simulator. Rows, budgets and rate limits go through it; a wrong
//! CA is a clear error naming the store, and the gateway keeps serving
//! (fail open) instead of crash-looping.

use std::time::Duration;

use patchbay_gateway::bootstrap;
use patchbay_gateway::config::Config;
use patchbay_sim::SimConfig;
use redis::AsyncCommands;

use crate::common::*;
use crate::redis_server::{pki, RedisServer, TempDir};

const PRICES: &str = "[[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\naudio_input = 32.0\n\
                      text_output = 16.0\naudio_output = 64.0\n";
/// The ACL user the TLS server knows; the default user is off, so only a
/// URL carrying this user and password gets in.
fn acl_args() -> Vec<&'static str> {
    vec![
        "--user", "default", "off", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all",
    ]
}

/// A TLS client for the test's own reads, trusting `ca_pem`.
async fn tls_conn(url: &str, ca_pem: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca_pem.as_bytes().to_vec()),
        },
    )
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .expect("the test reaches the TLS Redis")
}

async fn gateway_with_env(toml: &str, env: Vec<(&'static str, String)>) -> bootstrap::Running {
    let lookup = move |k: &str| {
        env.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.clone())
            .or_else(|| test_env(k))
    };
    let config = Config::from_toml_with_env(toml, &lookup).expect("test config is valid");
    bootstrap::start(config).await.expect("gateway starts")
}

async fn session_with_one_turn(addr: std::net::SocketAddr, key: &str) {
    let mut ws = open_with(addr, key).await.expect("admitted");
    one_turn(&mut ws).await;
    let _ = ws.close(None).await;
    let _ = until_close(&mut ws).await;
}

/// Stream rows of `key_id`, as field maps.
async fn stream_rows(
    conn: &mut redis::aio::MultiplexedConnection,
    key_id: &str,
) -> Vec<std::collections::HashMap<String, String>> {
    let entries: redis::streams::StreamRangeReply =
        conn.xrange_all("patchbay:request_logs").await.unwrap();
    entries
        .ids
        .into_iter()
        .map(|e| {
            e.map
                .into_iter()
                .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap()))
                .collect::<std::collections::HashMap<_, _>>()
        })
        .filter(|m| m.get("key_id").map(String::as_str) == Some(key_id))
        .collect()
}

#[tokio::test]
async fn rows_budgets_and_rate_limits_work_through_redis_over_tls_with_an_acl_user() {
    let pki = pki();
    let Some(server) = RedisServer::tls("redis_over_tls", &pki, &acl_args()).await else {
        return;
    };
    let dir = TempDir::new("tls-gw");
    let ca_file = dir.file("redis-ca.pem", &pki.ca_pem);
    let url = format!("rediss://alice:s3cret@127.0.0.1:{}", server.port);
    let id = unique("tls");
    let keys = dir.file(
        "keys.toml",
        &key_entry(&id, "pb-tls", "budget_usd = 100.0\nrpm = 2"),
    );
    let sim = sim(SimConfig::default()).await;
    let toml = gateway_toml(
        &sim.url(false),
        &format!(
            "{PRICES}[metering]\nflush_secs = 0\n[store]\nredis_url_env = \"PB_REDIS\"\nca_file = \"{}\"\n[keys]\nfile = \"{}\"\n",
            ca_file.display(),
            keys.display()
        ),
    );
    let gw = gateway_with_env(&toml, vec![("PB_REDIS", url.clone())]).await;

    session_with_one_turn(gw.addr, "pb-tls").await;
    session_with_one_turn(gw.addr, "pb-tls").await;
    // rpm = 2: the third session in this minute is refused, which only a
    // store that counted the first two (through TLS) can decide.
    let third = open_with(gw.addr, "pb-tls").await;
    assert_eq!(
        third.err(),
        Some(429),
        "rpm is enforced through the TLS store"
    );

    let mut conn = tls_conn(&url, &pki.ca_pem).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let rows = loop {
        let rows = stream_rows(&mut conn, &id).await;
        if rows.len() >= 2 {
            break rows;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rows never reached the TLS store ({} so far)",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(rows.len(), 2);
    let cost: f64 = rows
        .iter()
        .map(|r| r["cost_usd"].parse::<f64>().unwrap())
        .sum();
    assert!(cost > 0.0);
    let spent: f64 = conn
        .get(format!("patchbay:budget:key:{id}:total"))
        .await
        .unwrap();
    assert!((spent - cost).abs() < 1e-9, "budget {spent} vs rows {cost}");
    assert_eq!(
        metric(gw.admin_addr, "patchbay_store_errors_total", "").await,
        0.0
    );

    // Without the user's password the server refuses: the URL's ACL user
    // is what got the gateway in.
    let anonymous = redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{}", server.port),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pki.ca_pem.as_bytes().to_vec()),
        },
    )
    .unwrap();
    let mut anon = anonymous.get_multiplexed_async_connection().await;
    let refused = match &mut anon {
        Ok(c) => redis::cmd("GET")
            .arg("x")
            .query_async::<Option<String>>(c)
            .await
            .is_err(),
        Err(_) => true,
    };
    assert!(refused, "the default user is off");
}

#[tokio::test]
async fn a_wrong_ca_is_a_clear_error_naming_the_store_and_the_gateway_fails_open() {
    let pki = pki();
    let Some(server) = RedisServer::tls("wrong_ca", &pki, &[]).await else {
        return;
    };
    let other = crate::redis_server::pki();
    let dir = TempDir::new("wrong-ca");
    let wrong_ca = dir.file("other-ca.pem", &other.ca_pem);
    let sim = sim(SimConfig::default()).await;
    let endpoint = format!("rediss://127.0.0.1:{}", server.port);
    let mut child = Child::start(
        &sim.url(false),
        &format!(
            "{PRICES}[store]\nredis_url_env = \"PB_REDIS\"\nca_file = \"{}\"\n",
            wrong_ca.display()
        ),
        &[("PB_REDIS", &endpoint)],
    )
    .await;
    // Ready and serving: a session works (fail open) ...
    let mut ws = open_with(child.addr, CLIENT_KEY).await.expect("admitted");
    one_turn(&mut ws).await;
    // ... and the log says which store failed and why.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let logs = child.logs();
        let line = logs
            .lines()
            .find(|l| l.contains("cannot use the store at start"));
        if let Some(line) = line {
            assert!(line.contains(&endpoint), "names the store: {line}");
            assert!(
                line.to_lowercase().contains("certificate") || line.contains("UnknownIssuer"),
                "says the certificate is the problem: {line}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no start-up store error in the logs:\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        child.process.try_wait().unwrap().is_none(),
        "the gateway keeps running"
    );
    drop(server);
}
