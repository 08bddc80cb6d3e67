//! `[store] redis_url_file`: a rotated Redis URL (a mounted Secret) moves
//! the store to the new server without a restart.

use std::time::Duration;

use crate::common::*;
use crate::redis_server::RedisServer;
use patchbay_sim::SimConfig;
use redis::AsyncCommands;

/// Request ids of the rows of `key_id` in `url`'s stream.
async fn rows_of(url: &str, key_id: &str) -> Vec<String> {
    let mut r = redis(url).await;
    let entries: redis::streams::StreamRangeReply = r
        .xrevrange_count("patchbay:request_logs", "+", "-", 1000)
        .await
        .unwrap_or_default();
    entries
        .ids
        .iter()
        .filter(|e| {
            e.map
                .get("key_id")
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                .as_deref()
                == Some(key_id)
        })
        .map(|e| redis::from_redis_value(e.map["request_id"].clone()).unwrap())
        .collect()
}

#[tokio::test]
async fn a_rotated_redis_url_file_moves_the_store_to_the_new_server_without_a_restart() {
    let (Some(a), Some(b)) = (
        RedisServer::plain("redis_url_file", &[]).await,
        RedisServer::plain("redis_url_file", &[]).await,
    ) else {
        return;
    };
    let (url_a, url_b) = (
        format!("redis://{}", a.addr()),
        format!("redis://{}", b.addr()),
    );
    let sim = sim(SimConfig::default()).await;
    let url_file = TempFile::new("redis-url", &format!("{url_a}\n"));
    let id = unique("rotate");
    let keys = TempFile::new("keys.toml", &key_entry(&id, "pb-rotate", ""));
    let gw = gateway(&gateway_toml(
        &sim.url(false),
        &format!(
            "[metering]\nflush_secs = 0\n[store]\nredis_url_file = \"{}\"\n[keys]\nfile = \"{}\"\n",
            url_file.0.display(),
            keys.0.display()
        ),
    ))
    .await;
    let turn = || async {
        let mut ws = open_with(gw.addr, "pb-rotate").await.unwrap();
        one_turn(&mut ws).await;
        ws.close(None).await.unwrap();
        let _ = until_close(&mut ws).await;
    };
    turn().await;
    let mut on_a = Vec::new();
    for _ in 0..100 {
        on_a = rows_of(&url_a, &id).await;
        if !on_a.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(on_a.len(), 1, "the first row went to a");

    std::fs::write(&url_file.0, format!("{url_b}\n")).unwrap();
    let mut on_b = Vec::new();
    for _ in 0..100 {
        turn().await;
        on_b = rows_of(&url_b, &id).await;
        if !on_b.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!on_b.is_empty(), "rows reach b after the rotation");
    let on_a_after = rows_of(&url_a, &id).await;
    for row in &on_b {
        assert!(!on_a_after.contains(row), "{row} went to both");
    }
    // An invalid URL in the file keeps the connection where it is.
    std::fs::write(&url_file.0, "not a url\n").unwrap();
    assert!(
        eventually_async(|| async {
            metric(
                gw.admin_addr,
                "patchbay_config_reloads_total",
                "file=\"redis_url\",result=\"rejected\"",
            )
            .await
                >= 1.0
        })
        .await
    );
    let before = rows_of(&url_b, &id).await.len();
    turn().await;
    let mut after = before;
    for _ in 0..100 {
        after = rows_of(&url_b, &id).await.len();
        if after > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(after, before + 1, "still on b");
}

/// Polls an async condition for up to [`WAIT`].
async fn eventually_async<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f().await
}
