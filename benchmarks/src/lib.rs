//! `patchbay-bench`: a load generator for Realtime gateways.
//!
//! It opens `n` Realtime sessions, `c` at a time, interleaved over one or
//! more targets (session `i` to target `i mod T`), and measures each
//! session's phases ([`session`]): dial, session, first audio, turn, total.
//! The report gives success rates, p50/p95/p99 per phase and target, and the
//! p50 of every target against the first (the baseline) and any other named
//! with `--against`; the JSON file keeps every sample. A target's Prometheus endpoint can be scraped around the
//! run for the gateway's pool hit rate ([`scrape`]), and the process
//! serving a target named with its PID for its CPU per 1000 sessions
//! and memory ([`process`]).
//!
//! With `--calls N` it runs voice calls instead ([`calls`], [`calls_run`],
//! [`calls_report`]): N calls at once per target, each streaming small
//! appends and receiving the model's audio at real time, and reports each
//! frame's transit time per direction; with `--calls N --translation`,
//! translation sessions ([`translation`]) that stream audio for the whole
//! call, reported the same way per session-minute.
//!
//! The bench must not be what it measures: it reads event types from the
//! leading bytes of each frame and never parses audio, holds no copy of a
//! frame, resolves each target once, and runs on one thread by default (at
//! 500 concurrent sessions it needs well under one core; see the README).

pub mod args;
pub mod calls;
pub mod calls_report;
pub mod calls_run;
pub mod metered;
pub mod process;
pub mod relay_main;
pub mod report;
pub mod run;
pub mod scrape;
pub mod session;
pub mod stats;
pub mod tcp_relay;
pub mod translation;
pub mod ws_relay;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use args::Cli;
use report::{CpuResult, Meta, PoolResult, Report};
use run::{Plan, PlanError, RunResult, Target};
use scrape::PoolCounts;

/// Everything a finished run produced.
#[derive(Debug)]
pub struct Outcome {
    pub meta: Meta,
    pub targets: Vec<Target>,
    pub result: RunResult,
    pub pools: Vec<PoolResult>,
    /// CPU of each `--cpu-pid` process over the run.
    pub cpu: Vec<CpuResult>,
    /// Targets the report compares against ([`Cli::baselines`]).
    pub baselines: Vec<usize>,
}

impl Outcome {
    pub fn report(&self) -> Report<'_> {
        Report {
            meta: &self.meta,
            targets: &self.targets,
            result: &self.result,
            pools: &self.pools,
            cpu: &self.cpu,
            baselines: &self.baselines,
        }
    }
}

async fn scrape_all(cli: &Cli) -> Vec<Result<PoolCounts, String>> {
    let mut out = Vec::with_capacity(cli.metrics.len());
    for m in &cli.metrics {
        out.push(
            scrape::fetch(&m.url)
                .await
                .map(|text| PoolCounts::from_exposition(&text))
                .map_err(|e| e.to_string()),
        );
    }
    out
}

/// Resolves the targets, scrapes the metrics endpoints, runs the load,
/// scrapes again. `progress` prints a line to stderr every few seconds.
pub async fn execute(cli: &Cli, progress: bool) -> Result<Outcome, PlanError> {
    let mut targets = Vec::with_capacity(cli.targets.len());
    for t in &cli.targets {
        let key = cli.key_for(t);
        targets.push(Target::resolve(&t.name, &t.url, key.as_ref(), &cli.model, cli.beta).await?);
    }
    let before = scrape_all(cli).await;
    let plan = Arc::new(Plan {
        targets,
        sessions: cli.sessions,
        concurrency: cli.concurrency,
        timeout: cli.timeout(),
        progress,
        close_at: cli.close_at,
    });
    let started_unix_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (user0, sys0, _) = run::cpu_usage();
    let sched0 = run::sched_times();
    let procs0: Vec<_> = cli
        .cpu_pids
        .iter()
        .map(|c| process::before(c.pid))
        .collect();
    let result = run::run(plan.clone()).await;
    let cpu = cli
        .cpu_pids
        .iter()
        .zip(procs0)
        .map(|(c, b)| {
            let used = b.and_then(|b| process::since(c.pid, &b));
            (c.name.clone(), used.map_err(|e| e.to_string()))
        })
        .collect();
    let (user1, sys1, max_rss_kib) = run::cpu_usage();
    let cpu_wait = sched0
        .zip(run::sched_times())
        .map(|((_, w0), (_, w1))| w1.saturating_sub(w0).as_secs_f64());
    let after = scrape_all(cli).await;
    let pools = cli
        .metrics
        .iter()
        .zip(before.iter().zip(after))
        .map(|(m, (b, a))| {
            // A failed "before" scrape counts from zero, as for a fresh gateway.
            let b = b.clone().unwrap_or_default();
            (m.name.clone(), a.map(|a| a.since(&b)))
        })
        .collect();
    let meta = Meta {
        started_unix_secs,
        sessions: cli.sessions,
        concurrency: cli.concurrency,
        timeout_secs: cli.timeout_secs,
        model: cli.model.clone(),
        beta: cli.beta,
        threads: cli.threads,
        wall_secs: result.wall.as_secs_f64(),
        bench_cpu_user_secs: (user1.saturating_sub(user0)).as_secs_f64(),
        bench_cpu_sys_secs: (sys1.saturating_sub(sys0)).as_secs_f64(),
        bench_max_rss_kib: max_rss_kib,
        bench_cpu_wait_secs: cpu_wait,
    };
    let targets = Arc::try_unwrap(plan).map_or_else(|p| p.targets.clone(), |p| p.targets);
    Ok(Outcome {
        meta,
        targets,
        result,
        pools,
        cpu,
        baselines: cli.baselines(),
    })
}
