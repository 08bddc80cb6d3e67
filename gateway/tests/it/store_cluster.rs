//! Every user of the store on a real Redis Cluster (three primaries, three
//! replicas) and behind a real Sentinel set: the metering store
//! (admission, flushes sent twice, replays), session leases, client-secret
//! configs and the calls fleet work as on one server; in the cluster every
//! key they write carries the hash tag of its scope and sits in that tag's
//! slot, and `redis-cli --cluster check` passes. The same holds over TLS
//! (`rediss+cluster://`, `rediss+sentinel://`, TLS-only topologies, the
//! store trusting only `ca_file`), and a cluster whose certificate another
//! CA signed is refused.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use patchbay_gateway::calls::fleet::{CallFleet, CallRecord};
use patchbay_gateway::client_secret::configs::SessionConfigs;
use patchbay_gateway::config::{BudgetPeriod, RouteConfig};
use patchbay_gateway::logs::RequestLogRow;
use patchbay_gateway::metrics::Metrics;
use patchbay_gateway::store::conn::RedisConn;
use patchbay_gateway::store::leases::{Acquire, Leases};
use patchbay_gateway::store::redis::RedisStore;
use patchbay_gateway::store::{
    AdmitQuery, BudgetKey, FlushBatch, FlushId, Replayed, RpmWindow, Scope, Store,
};

use crate::common::unique;
use crate::redis_server::{pki, TempDir};
use crate::redis_topology::{hash_tag, key_slot, query_on, RedisCluster, SentinelSet, MASTER_NAME};

fn budget(scope: Scope, id: &str) -> BudgetKey {
    BudgetKey {
        scope,
        id: id.into(),
        period: BudgetPeriod::Total,
    }
}

fn row(key: &str, session: &str, n: u64, cost: f64) -> RequestLogRow {
    RequestLogRow {
        request_id: format!("{session}:{n}"),
        session_id: session.into(),
        key_id: key.into(),
        cost_usd: cost,
        ..RequestLogRow::default()
    }
}

#[tokio::test]
async fn every_store_user_works_on_a_cluster_with_each_key_in_its_tags_slot() {
    let Some(mut cluster) =
        RedisCluster::start("every_store_user_works_on_a_cluster_with_each_key_in_its_tags_slot")
            .await
    else {
        return;
    };
    let prefix = format!("{}:", unique("pbc"));
    let conn = RedisConn::new(&cluster.url(), None).unwrap();
    assert!(conn.tagged());
    let seed = format!("redis://127.0.0.1:{}", cluster.node_ports()[0]);
    let mut reader = redis::cluster::ClusterClient::new(vec![seed])
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let (fleet, held) = exercise(&conn, &prefix, &mut reader).await;
    check_tagged_keys(&mut cluster, &prefix).await;
    fleet.forget(&route(), "rtc_1").await;
    assert_eq!(fleet.record("rtc_1").await.unwrap(), None);
    drop(held);
}

#[tokio::test]
async fn every_store_user_works_on_a_tls_cluster() {
    let ours = pki();
    let Some(mut cluster) =
        RedisCluster::start_tls("every_store_user_works_on_a_tls_cluster", &ours).await
    else {
        return;
    };
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://127.0.0.1:"), "{url}");
    let dir = TempDir::new("tls-cluster-ca");
    let ca_file = dir.file("ca.pem", &ours.ca_pem);
    // TLS-only nodes report their TLS ports to a TLS client: in
    // `CLUSTER SLOTS`, which the store's client routes by.
    let ports = cluster.node_ports();
    let slots: Vec<Vec<redis::Value>> = query_on(cluster.tls(), ports[0], &["CLUSTER", "SLOTS"])
        .await
        .unwrap();
    assert_eq!(slots.len(), 3, "{slots:?}");
    for range in &slots {
        for node in &range[2..] {
            let node: Vec<redis::Value> = redis::from_redis_value(node.clone()).unwrap();
            let port: u16 = redis::from_redis_value(node[1].clone()).unwrap();
            assert!(ports.contains(&port), "{port} is not a TLS port: {slots:?}");
        }
    }
    let prefix = format!("{}:", unique("pbct"));
    let conn = RedisConn::new(&url, Some(&ca_file)).unwrap();
    assert!(conn.tagged());
    let seed = format!("rediss://127.0.0.1:{}", cluster.node_ports()[0]);
    let mut reader = redis::cluster::ClusterClientBuilder::new(vec![seed])
        .certs(cluster.tls().unwrap().certs())
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let (fleet, held) = exercise(&conn, &prefix, &mut reader).await;
    check_tagged_keys(&mut cluster, &prefix).await;
    fleet.forget(&route(), "rtc_1").await;
    assert_eq!(fleet.record("rtc_1").await.unwrap(), None);
    drop(held);

    // The same cluster, the store trusting another CA: refused, in bounded
    // time (verification is on for every node).
    refused_under_another_ca(
        &dir,
        &url,
        &prefix,
        "a cluster signed by another CA is refused",
    )
    .await;
}

/// `url` with the store trusting a CA that signed none of its nodes: the
/// ping is refused (`what`) within a bound, naming the certificate.
async fn refused_under_another_ca(dir: &TempDir, url: &str, prefix: &str, what: &str) {
    let other = dir.file("other-ca.pem", &pki().ca_pem);
    let conn = RedisConn::new(url, Some(&other)).unwrap();
    let store = RedisStore::with_conn(conn, prefix);
    let started = std::time::Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(20), store.ping())
        .await
        .expect("the ping ends within 20 s");
    let err = refused.expect_err(what);
    eprintln!("another CA: refused after {:?}: {err}", started.elapsed());
    assert!(err.to_string().contains("certificate"), "{err}");
}

/// Every key under `prefix` has its scope's hash tag and is in that tag's
/// slot, and `redis-cli --cluster check` passes.
async fn check_tagged_keys(cluster: &mut RedisCluster, prefix: &str) {
    let keys: Vec<_> = cluster
        .keys()
        .await
        .into_iter()
        .filter(|k| k.key.starts_with(prefix))
        .collect();
    let tags: HashSet<&str> = keys
        .iter()
        .map(|k| {
            let tag = hash_tag(&k.key).unwrap_or_else(|| panic!("{} has no hash tag", k.key));
            assert_eq!(k.slot, key_slot(tag), "{}", k.key);
            tag
        })
        .collect();
    let want: HashSet<&str> = ["k1", "t1", "m1", "cs1", "rtc_1"].into_iter().collect();
    assert!(
        tags.iter().any(|t| t.starts_with("m1:")),
        "the route's set of calls: {tags:?}"
    );
    assert_eq!(
        tags.iter()
            .filter(|t| !t.starts_with("m1:"))
            .copied()
            .collect::<HashSet<_>>(),
        want
    );
    let (ok, report) = cluster.check().await;
    assert!(ok, "{report}");
}

#[tokio::test]
async fn every_store_user_works_behind_sentinel() {
    let Some(set) = SentinelSet::start("every_store_user_works_behind_sentinel").await else {
        return;
    };
    let prefix = format!("{}:", unique("pbs"));
    let conn = RedisConn::new(&set.url(), None).unwrap();
    assert!(!conn.tagged(), "behind Sentinel the names are one server's");
    let mut reader = redis::Client::open(format!("redis://127.0.0.1:{}", set.primary_port()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    exercise_behind_sentinel(&conn, &prefix, &mut reader).await;
}

#[tokio::test]
async fn every_store_user_works_behind_sentinel_over_tls() {
    let ours = pki();
    let Some(set) =
        SentinelSet::start_tls("every_store_user_works_behind_sentinel_over_tls", &ours).await
    else {
        return;
    };
    let url = set.url();
    assert!(url.starts_with("rediss+sentinel://127.0.0.1:"), "{url}");
    let dir = TempDir::new("tls-sentinel-ca");
    let ca_file = dir.file("ca.pem", &ours.ca_pem);
    let prefix = format!("{}:", unique("pbst"));
    // The sentinels name the primary by its TLS port.
    for s in set.sentinel_ports() {
        let addr: Vec<String> = query_on(
            set.tls(),
            s,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        )
        .await
        .unwrap();
        assert_eq!(addr[1], set.primary_port().to_string());
    }
    let conn = RedisConn::new(&url, Some(&ca_file)).unwrap();
    assert!(!conn.tagged());
    let mut reader = redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{}", set.primary_port()),
        set.tls().unwrap().certs(),
    )
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    exercise_behind_sentinel(&conn, &prefix, &mut reader).await;

    // The same sentinels, the store trusting another CA: refused, in
    // bounded time.
    refused_under_another_ca(
        &dir,
        &url,
        &prefix,
        "sentinels signed by another CA are refused",
    )
    .await;
}

/// `exercise`, then the team's budget read on the primary the sentinels
/// name.
async fn exercise_behind_sentinel(
    conn: &RedisConn,
    prefix: &str,
    reader: &mut redis::aio::MultiplexedConnection,
) {
    let (fleet, held) = exercise(conn, prefix, reader).await;
    let budget: f64 = redis::cmd("GET")
        .arg(format!("{prefix}budget:team:t1:total"))
        .query_async(reader)
        .await
        .unwrap();
    assert_eq!(budget, 1.0, "on the primary the sentinels name");
    fleet.forget(&route(), "rtc_1").await;
    drop(held);
}

fn route() -> RouteConfig {
    RouteConfig {
        model: "m1".into(),
        upstream_url: "wss://upstream.invalid/v1/realtime".into(),
        ..RouteConfig::default()
    }
}

/// Drives every store user on `conn` under `prefix` and checks their
/// answers; `reader` reads the request-log stream. Returns the fleet (its
/// call still registered) and the lease still held.
async fn exercise(
    conn: &RedisConn,
    prefix: &str,
    reader: &mut impl redis::aio::ConnectionLike,
) -> (CallFleet, patchbay_gateway::store::leases::Lease) {
    assert!(!format!("{conn:?}").contains('@'), "{conn:?}");
    let store = RedisStore::with_conn(conn.clone(), prefix);
    store.ping().await.expect("the store answers");

    let (key, team, model) = ("k1", "t1", "m1");
    let budgets = vec![
        budget(Scope::Key, key),
        budget(Scope::Team, team),
        budget(Scope::Route, model),
    ];
    let now = SystemTime::now();
    let admit = AdmitQuery {
        key_id: key.into(),
        rpm: RpmWindow::Count,
        read_tpm: true,
        budgets: budgets.clone(),
        now,
    };
    let first = store.admit(&admit).await.unwrap();
    assert_eq!(first.rpm.unwrap().current, 1);
    assert_eq!(first.budgets, [0.0, 0.0, 0.0]);

    let batch = |seq: u64, cost: f64| FlushBatch {
        id: Some(FlushId {
            session_id: "s1".into(),
            seq,
        }),
        now,
        charges: budgets.iter().map(|b| (b.clone(), cost)).collect(),
        tpm: Some((key.into(), 100)),
        rows: vec![row(key, "s1", seq, cost)],
        stream_maxlen: 0,
    };
    let one = batch(1, 0.25);
    assert_eq!(store.flush(&one).await.unwrap(), [0.25, 0.25, 0.25]);
    // Sent again (its reply lost): every part is recognised as applied.
    assert_eq!(store.flush(&one).await.unwrap(), [0.25, 0.25, 0.25]);
    let two = batch(2, 0.5);
    let replayed = store.replay(&[&one, &two]).await.unwrap();
    assert_eq!(replayed, [Replayed::Applied, Replayed::Applied]);
    assert_eq!(
        store.replay(&[&two]).await.unwrap(),
        [Replayed::Applied],
        "a replayed write already applied is applied once"
    );
    let after = store.admit(&admit).await.unwrap();
    assert_eq!(after.budgets, [0.75, 0.75, 0.75]);
    assert_eq!(after.rpm.unwrap().current, 2);
    assert_eq!(after.tpm.unwrap().current, 200);
    // Confirmed by a replica (each primary here has one): the same write
    // path, with a WAIT in the write's pipeline on the write's node.
    // A confirmation late on a loaded machine is an error whose write the
    // outbox replays: replayed until confirmed, it counts once.
    let confirmed = RedisStore::with_conn(conn.clone(), prefix).with_replica_acks(1);
    let three = batch(3, 0.25);
    if let Err(e) = confirmed.flush(&three).await {
        assert!(e.to_string().contains("replicas confirmed"), "{e}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while confirmed.replay(&[&three]).await.ok() != Some(vec![Replayed::Applied]) {
        assert!(std::time::Instant::now() < deadline, "never confirmed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(store.flush(&three).await.unwrap(), [1.0, 1.0, 1.0]);
    store
        .unadmit(key, patchbay_gateway::store::window_position(now).0)
        .await
        .unwrap();

    // The key's rows, each once, in its stream.
    let names = store.names();
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(names.request_logs(key))
        .arg("-")
        .arg("+")
        .query_async(reader)
        .await
        .unwrap();
    let ids: Vec<String> = entries
        .ids
        .iter()
        .map(|e| e.get::<String>("request_id").unwrap())
        .collect();
    assert_eq!(ids, ["s1:1", "s1:2", "s1:3"]);

    // Leases: the cap holds across the cluster's slots.
    let leases = Leases::with_conn(conn.clone(), prefix, Arc::new(Metrics::new()));
    let held = match leases.acquire(key, "l1", 1, now).await.unwrap() {
        Acquire::Granted { lease, .. } => lease,
        Acquire::Full { .. } => panic!("the first lease is refused"),
    };
    assert!(matches!(
        leases.acquire(key, "l2", 1, now).await.unwrap(),
        Acquire::Full { holders: 1 }
    ));
    leases.renew(now).await.unwrap();
    assert_eq!(leases.live(key, now).await.unwrap(), 1);

    // Client-secret configs.
    let configs = SessionConfigs::on(conn.clone(), prefix);
    assert!(configs
        .put("cs1", "{\"a\":1}", Duration::from_secs(60))
        .await
        .unwrap());
    assert_eq!(
        configs.get("cs1").await.unwrap().as_deref(),
        Some("{\"a\":1}")
    );

    // The calls fleet: a record, its holder and the route's set of calls.
    let fleet = CallFleet::new(conn.clone(), prefix, Arc::new(Metrics::new()));
    let rec = CallRecord {
        call_id: "rtc_1".into(),
        key_id: key.into(),
        team: Some(team.into()),
        model: model.into(),
        transport: "webrtc".into(),
        client_secret_id: None,
        lease_id: None,
        started_unix_ms: 1,
        accepting: false,
    };
    fleet
        .register(&route(), &rec, Duration::from_secs(60))
        .await;
    assert_eq!(fleet.record("rtc_1").await.unwrap(), Some(rec.clone()));
    assert_eq!(fleet.renew("rtc_1").await, Some(true));
    let other = CallFleet::new(conn.clone(), prefix, Arc::new(Metrics::new()));
    assert!(
        other.claim_orphans(&route()).await.is_empty(),
        "a held call is not adopted"
    );
    (fleet, held)
}
