//! A flush as calls of the flush script ([`super::redis::FLUSH_SCRIPT`]).
//!
//! On one server a batch is one call, atomic, under one write mark per
//! session. In a cluster a script may only touch keys of one slot, so a
//! batch is split by the scope each key serves: the client key's part
//! (its budgets, its tpm minute and the rows, into the key's own stream)
//! and one part per other budget scope (a team's, a route's). Each part
//! carries its own write mark beside its keys
//! (`flushed:<scope>:{<id>}:<session>`), so each part is applied exactly
//! once however often the batch is sent; the outbox keeps the batch until
//! every part is confirmed.

use super::{period_ttl, window_position, FlushBatch, KeyNames, Scope, FLUSH_MARK_TTL, WINDOW_TTL};
use crate::logs::FIELDS;

/// One script call: its KEYS and ARGV, and which of the batch's charges
/// (by index) it applies, in the order it returns their totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub keys: Vec<String>,
    pub args: Vec<String>,
    pub charges: Vec<usize>,
}

/// The client key a batch writes for: its tpm window's, its rows', or its
/// key budget's.
fn key_id(batch: &FlushBatch) -> Option<&str> {
    batch
        .tpm
        .as_ref()
        .map(|(k, _)| k.as_str())
        .or_else(|| batch.rows.first().map(|r| r.key_id.as_str()))
        .or_else(|| {
            batch
                .charges
                .iter()
                .find(|(b, _)| b.scope == Scope::Key)
                .map(|(b, _)| b.id.as_str())
        })
}

/// The script calls that write `batch`: one untagged, one per scope tagged.
pub fn parts(names: &KeyNames, batch: &FlushBatch) -> Vec<Part> {
    let key = key_id(batch);
    // (scope, id, charge indices, carries the tpm and rows)
    let mut groups: Vec<(Scope, &str, Vec<usize>, bool)> = Vec::new();
    if let Some(k) = key {
        groups.push((Scope::Key, k, Vec::new(), true));
    }
    for (i, (b, _)) in batch.charges.iter().enumerate() {
        let home = if names.tagged() {
            groups
                .iter()
                .position(|(s, id, _, _)| *s == b.scope && *id == b.id)
        } else {
            (!groups.is_empty()).then_some(0)
        };
        match home {
            Some(g) => groups[g].2.push(i),
            None => groups.push((b.scope, b.id.as_str(), vec![i], !names.tagged())),
        }
    }
    if groups.is_empty() && !names.tagged() {
        // One server: every batch is one call (a replay counts on it).
        groups.push((Scope::Key, "", Vec::new(), true));
    }
    groups
        .into_iter()
        .map(|(scope, id, charges, main)| part(names, batch, scope, id, charges, main))
        .collect()
}

fn part(
    names: &KeyNames,
    batch: &FlushBatch,
    scope: Scope,
    id: &str,
    charges: Vec<usize>,
    main: bool,
) -> Part {
    let session = batch.id.as_ref().map_or("", |id| id.session_id.as_str());
    let mark = names.flushed(session, scope, id);
    let rows = if main { batch.rows.as_slice() } else { &[] };
    // A part without rows never touches the stream; its mark stands in for
    // it so every key of the call is in one slot.
    let stream = if main {
        names.request_logs(id)
    } else {
        mark.clone()
    };
    let mut keys = vec![mark, stream];
    keys.extend(
        charges
            .iter()
            .map(|&i| names.budget(&batch.charges[i].0, batch.now)),
    );
    let (minute, _) = window_position(batch.now);
    let tpm_by = match batch.tpm.as_ref().filter(|_| main) {
        Some((key_id, tokens)) => {
            keys.push(names.tpm(key_id, minute));
            // Redis integers are i64; the meter caps an increment far
            // below that (`MAX_TPM_INCREMENT`).
            i64::try_from(*tokens).unwrap_or(i64::MAX)
        }
        None => 0,
    };
    let mut args = Vec::with_capacity(8 + FIELDS.len() * (1 + rows.len()) + 2 * charges.len());
    args.push(batch.id.as_ref().map_or(0, |id| id.seq).to_string());
    args.push(FLUSH_MARK_TTL.as_secs().to_string());
    args.push(batch.stream_maxlen.to_string());
    args.push(charges.len().to_string());
    args.push(tpm_by.to_string());
    args.push(WINDOW_TTL.as_secs().to_string());
    args.push(rows.len().to_string());
    args.push(FIELDS.len().to_string());
    args.extend(FIELDS.iter().map(|f| f.to_string()));
    for &i in &charges {
        let (b, cost) = &batch.charges[i];
        args.push(cost.max(0.0).to_string());
        let ttl = period_ttl(b.period, batch.now).map_or(0, |t| t.as_secs());
        args.push(ttl.to_string());
    }
    for row in rows {
        args.extend(row.stream_fields().into_iter().map(|(_, v)| v));
    }
    Part {
        keys,
        args,
        charges,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::config::BudgetPeriod;
    use crate::store::{BudgetKey, FlushId};

    fn budget(scope: Scope, id: &str) -> BudgetKey {
        BudgetKey {
            scope,
            id: id.into(),
            period: BudgetPeriod::Total,
        }
    }

    fn batch() -> FlushBatch {
        let mut row = crate::logs::tests::sample();
        row.key_id = "k1".into();
        FlushBatch {
            id: Some(FlushId {
                session_id: "s1".into(),
                seq: 3,
            }),
            now: UNIX_EPOCH + Duration::from_secs(600),
            charges: vec![
                (budget(Scope::Route, "m"), 0.5),
                (budget(Scope::Key, "k1"), 0.5),
                (budget(Scope::Team, "t"), 0.5),
            ],
            tpm: Some(("k1".into(), 40)),
            rows: vec![row],
            stream_maxlen: 0,
        }
    }

    /// The hash tag of a key (what Redis Cluster hashes).
    fn tag(key: &str) -> &str {
        let open = key.find('{').expect(key);
        let close = key[open..].find('}').expect(key) + open;
        &key[open + 1..close]
    }

    #[test]
    fn one_server_writes_a_batch_in_one_call_under_one_mark() {
        let ps = parts(&KeyNames::new("p:"), &batch());
        assert_eq!(ps.len(), 1);
        let p = &ps[0];
        assert_eq!(
            p.keys,
            [
                "p:flushed:s1",
                "p:request_logs",
                "p:budget:route:m:total",
                "p:budget:key:k1:total",
                "p:budget:team:t:total",
                "p:tpm:k1:10"
            ]
        );
        assert_eq!(p.charges, [0, 1, 2]);
        assert_eq!(
            &p.args[..8],
            [
                "3",
                "21600",
                "0",
                "3",
                "40",
                "120",
                "1",
                &FIELDS.len().to_string()
            ]
        );
    }

    #[test]
    fn a_cluster_writes_each_scope_in_its_own_slot_with_its_own_mark() {
        let ps = parts(&KeyNames::with_tags("p:", true), &batch());
        let shape: Vec<_> = ps
            .iter()
            .map(|p| (p.keys.clone(), p.charges.clone()))
            .collect();
        assert_eq!(
            shape,
            [
                (
                    vec![
                        "p:flushed:key:{k1}:s1".to_string(),
                        "p:request_logs:{k1}".into(),
                        "p:budget:key:{k1}:total".into(),
                        "p:tpm:{k1}:10".into()
                    ],
                    vec![1]
                ),
                (
                    vec![
                        "p:flushed:route:{m}:s1".to_string(),
                        "p:flushed:route:{m}:s1".into(),
                        "p:budget:route:{m}:total".into()
                    ],
                    vec![0]
                ),
                (
                    vec![
                        "p:flushed:team:{t}:s1".to_string(),
                        "p:flushed:team:{t}:s1".into(),
                        "p:budget:team:{t}:total".into()
                    ],
                    vec![2]
                ),
            ]
        );
        for p in &ps {
            let t = tag(&p.keys[0]);
            assert!(p.keys.iter().all(|k| tag(k) == t), "{:?}", p.keys);
        }
        // Only the key's part carries the rows and the tokens.
        assert_eq!(ps[0].args[4], "40");
        assert_eq!(ps[0].args[6], "1");
        assert!(ps[1..].iter().all(|p| p.args[4] == "0" && p.args[6] == "0"));
    }

    #[test]
    fn a_batch_of_team_spend_alone_is_one_part_in_the_teams_slot() {
        let mut b = batch();
        b.tpm = None;
        b.rows.clear();
        b.charges.retain(|(k, _)| k.scope == Scope::Team);
        let ps = parts(&KeyNames::with_tags("p:", true), &b);
        assert_eq!(ps.len(), 1);
        assert_eq!(ps[0].keys[0], "p:flushed:team:{t}:s1");
        assert_eq!(ps[0].charges, [0]);
    }
}
