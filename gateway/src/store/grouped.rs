//! Pipelines that respect hash slots. On one server (or behind Sentinel)
//! every command goes into one pipeline, one round trip, as before; in a
//! cluster the commands are split by the hash tag they were given, one
//! pipeline per tag (each within one slot, so one node), sent concurrently,
//! and the replies put back in the order the commands were added. Commands
//! of one tag keep their order; commands of different tags have none (a
//! pipeline is not a transaction anyway).

use std::time::Duration;

use redis::{Cmd, Pipeline, Value};

use super::conn::Conn;
use super::StoreError;

/// Commands to send, each under the hash tag of its keys.
pub struct Grouped {
    tagged: bool,
    /// `(tag, pipeline)`; one entry when untagged.
    groups: Vec<(String, Pipeline)>,
    /// For each reply to keep, in order: its group.
    kept: Vec<usize>,
}

impl Grouped {
    pub fn new(tagged: bool) -> Self {
        Self {
            tagged,
            groups: Vec::new(),
            kept: Vec::new(),
        }
    }

    fn group(&mut self, tag: &str) -> usize {
        let tag = if self.tagged { tag } else { "" };
        match self.groups.iter().position(|(t, _)| t == tag) {
            Some(i) => i,
            None => {
                self.groups.push((tag.to_string(), redis::pipe()));
                self.groups.len() - 1
            }
        }
    }

    /// Adds `cmd`, whose reply is returned by [`Grouped::run`].
    pub fn keep(&mut self, tag: &str, cmd: Cmd) -> &mut Self {
        let g = self.group(tag);
        self.groups[g].1.add_command(cmd);
        self.kept.push(g);
        self
    }

    /// Adds `cmd`, whose reply is dropped.
    pub fn ignore(&mut self, tag: &str, cmd: Cmd) -> &mut Self {
        let g = self.group(tag);
        self.groups[g].1.add_command(cmd).ignore();
        self
    }

    /// Every command, group after group.
    #[cfg(test)]
    pub fn commands(&self) -> impl Iterator<Item = &Cmd> {
        self.groups.iter().flat_map(|(_, p)| p.cmd_iter())
    }

    /// Sends every group (concurrently), each bounded by `timeout`, and
    /// returns the kept replies in the order they were added.
    pub async fn run(
        &self,
        conn: &Conn,
        op: &'static str,
        timeout: Duration,
    ) -> Result<Vec<Value>, StoreError> {
        let sends = self.groups.iter().map(|(_, pipe)| {
            let mut conn = conn.clone();
            async move {
                match tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(&mut conn)).await
                {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(source)) => Err(StoreError::Redis { op, source }),
                    Err(_) => Err(StoreError::Timeout { op, after: timeout }),
                }
            }
        });
        let replies = futures_util::future::try_join_all(sends).await?;
        let mut iters: Vec<_> = replies.into_iter().map(Vec::into_iter).collect();
        self.kept
            .iter()
            .map(|&g| {
                iters[g].next().ok_or_else(|| StoreError::Reply {
                    op,
                    message: "fewer replies than commands".into(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(g: &Grouped) -> Vec<(String, usize)> {
        g.groups
            .iter()
            .map(|(t, p)| (t.clone(), p.cmd_iter().count()))
            .collect()
    }

    #[test]
    fn untagged_commands_share_one_pipeline_and_tagged_ones_split_by_tag() {
        for (tagged, want) in [
            (false, vec![(String::new(), 4)]),
            (true, vec![("a".to_string(), 3), ("b".to_string(), 1)]),
        ] {
            let mut g = Grouped::new(tagged);
            g.keep("a", redis::cmd("GET").arg("{a}x").to_owned())
                .keep("b", redis::cmd("GET").arg("{b}y").to_owned())
                .ignore("a", redis::cmd("EXPIRE").arg("{a}x").arg(1).to_owned())
                .keep("a", redis::cmd("GET").arg("{a}z").to_owned());
            assert_eq!(shape(&g), want);
            assert_eq!(g.kept.len(), 3);
        }
    }
}
