//! The meter task: one per session, fed by its [`TurnTracker`] through a
//! bounded channel. A WebSocket session runs it inside its own task
//! ([`InlineMeter`]: polled beside the relay only when it woke, its final
//! flush done in place when the store answers at once and in a task of its
//! own when it does not); a call's sideband spawns it on the gateway's
//! `TaskTracker`.
//!
//! Every `[metering] flush_secs` (default 15), and once more when the
//! tracker is finished (the channel closes), a flush:
//! 1. turns the window's turns into request-log rows, priced with the price
//!    table as it is now (an edited price applies from the next flush), each
//!    turn's charge bounded by the plausibility rule ([`pricing::charge`]:
//!    an implausible usage is flagged, logged and counted, and charged at
//!    most `max_turn_usd`), and queues them for stdout (written by the row
//!    writer thread, never here);
//! 2. in one idempotent store round trip (the session's next [`FlushId`]),
//!    appends the rows to the Redis stream, adds the window's cost to every
//!    applicable budget counter (key, team, route) and its tokens to the
//!    key's tpm window;
//! 3. compares the budget totals that round trip returned with the limits
//!    and fires the [`KillSignal`] when one is spent. The counters are shared
//!    with every session of the same scope, so an idle session is closed on
//!    its next tick when others spend the budget.
//!
//! `flush_secs = 0` flushes after every turn (turns already queued are
//! flushed together) and re-reads the budgets every [`BUDGET_TICK`].
//!
//! The key is re-read whenever the key store's set is swapped (the meter
//! subscribes to it; before, it polled every second, a timer per session):
//! a removed or disabled key, or one whose id now has another secret (a
//! rotation), fires the kill at once; a changed budget or tpm applies from
//! the next flush.
//!
//! Overshoot: a budget is checked at flushes, so a session can spend up to
//! one flush window plus the turn in flight past its limit before it is
//! closed; N sessions sharing a budget can overshoot by N such amounts.
//!
//! Store failures fail open: rows still reach stdout, `store_errors` counts
//! the failure, and the write (rows, cost, tokens, with its [`FlushId`])
//! goes to the process's outbox ([`super::outbox`]), which replays it when
//! the store answers again; while anything waits there, later writes queue
//! behind it so they land in order. A write is applied once even when its
//! reply was lost, so nothing is lost or counted twice, the final flush
//! included. While a session's writes wait, its kill decision uses the last
//! totals the store returned plus the spend still waiting (its own spend
//! keeps counting; others' spend is invisible until the store answers).
//!
//! [`TurnTracker`]: super::TurnTracker
//! [`FlushId`]: crate::store::FlushId
//! [`KillSignal`]: super::KillSignal

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::{interval_at, Instant, MissedTickBehavior};
use tokio_util::task::TaskTracker;

use super::budgets::{applicable_budgets, budget_message};
use super::call_time::CallClock;
use super::live::{LiveUsage, LiveWindows};
use super::outbox::{Queued, QueuedState};
use super::pricing::{self, Usage};
use super::shared::{bounded, SessionMeta, Shared};
use super::tracker::{
    SentRecord, TurnKind, TurnRecord, OUTCOME_BUDGET_EXHAUSTED, OUTCOME_KEY_REVOKED,
};
use super::translation::{self, AudioCounters};
use crate::auth::{KeyEntry, KeySet, TeamEntry};
use crate::config::PriceRow;
use crate::event::error_event;
use crate::logs::RequestLogRow;
use crate::metrics::{model, ModelMeters};
use crate::relay::on_wake::OnWake;
use crate::relay::Kill;
use crate::store::{BudgetKey, FlushBatch, FlushId};
use crate::telemetry::semconv::Turn;

/// How often budgets are re-read when `flush_secs = 0`.
pub const BUDGET_TICK: Duration = Duration::from_secs(1);
/// Ceiling of one flush's tpm increment. Real turns are thousands of tokens;
/// a bogus usage report must not push a Redis counter past i64, where every
/// later INCRBY on it would fail (and with it every flush of that key).
pub const MAX_TPM_INCREMENT: u64 = 1 << 40;
/// A window this large is flushed before its tick.
pub const MAX_WINDOW_TURNS: usize = 256;
/// The row model (and metric label) of transcription usage when no session
/// event named the transcription model, or named one without a `[[prices]]`
/// row: a string from the session is never a row model or a label unless it
/// is a configured model.
pub const UNKNOWN_TRANSCRIPTION_MODEL: &str = "unknown-transcription-model";
/// Close code for budget and key kills (policy violation).
pub const KILL_CLOSE_CODE: u16 = 1008;

/// A session's meter run inside the session's own task instead of a task
/// of its own: no spawn, and no hop through the scheduler for each turn
/// record and for the end. [`Self::beside`] polls it next to the relay,
/// only when it woke ([`OnWake`]); [`Self::finish`], once its tracker is
/// finished, gives it the poll that makes its final flush. A flush that has
/// to wait for its store (Redis) then finishes in a task of its own, so the
/// session (its admission permit, its log line) never waits on the store.
pub struct InlineMeter {
    run: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
}

impl InlineMeter {
    pub fn new(meter: MeterTask) -> Self {
        Self {
            run: Box::pin(meter.run()),
            done: false,
        }
    }

    /// Runs `work` (the relay), the meter polled beside it whenever it woke
    /// (a turn record, a flush tick, a key change). The meter cannot end
    /// before its tracker is finished, which `work` holds. `work` is pinned
    /// by the caller, so its (large) future is stored once, in the caller's.
    pub fn beside<'a, F: Future + ?Sized>(
        &'a mut self,
        mut work: Pin<&'a mut F>,
    ) -> impl Future<Output = F::Output> + 'a {
        let done = &mut self.done;
        let mut meter = OnWake::new(self.run.as_mut());
        std::future::poll_fn(move |cx| {
            if !*done && Pin::new(&mut meter).poll(cx).is_ready() {
                *done = true;
            }
            work.as_mut().poll(cx)
        })
    }

    /// After the tracker is finished (its channel closed): the final flush,
    /// here when it needs no wait, else on `tasks` (tracked, so a drain
    /// waits for it).
    pub fn finish(mut self, tasks: &TaskTracker) {
        if self.done {
            return;
        }
        let mut cx = Context::from_waker(Waker::noop());
        if self.run.as_mut().poll(&mut cx).is_pending() {
            tasks.spawn(self.run);
        }
    }
}

/// A session's meter; run it with [`MeterTask::run`].
#[derive(Debug)]
pub struct MeterTask {
    shared: Arc<Shared>,
    meta: SessionMeta,
    rx: mpsc::Receiver<SentRecord>,
    kill: watch::Sender<Option<Kill>>,
    window: Vec<TurnRecord>,
    /// Writes made so far (the next one is `seq + 1`).
    seq: u64,
    /// This session's writes still in the outbox.
    queued: Vec<Arc<Queued>>,
    /// Spend of this session's writes the outbox dropped: the store never
    /// counts it, so the kill decision adds it.
    lost_usd: f64,
    /// The spend per budget as last estimated (store total plus what waits).
    estimate: Vec<(BudgetKey, f64)>,
    /// The key as last read from the key store.
    key: KeyEntry,
    team: Option<TeamEntry>,
    keyset_seen: Option<Arc<KeySet>>,
    /// The turn counters of the session's model.
    meters: Arc<ModelMeters>,
    /// A translation session's audio, taken every window.
    audio: Option<AudioSource>,
    /// Windows of audio taken so far, and when the current one began.
    audio_windows: u64,
    audio_since: SystemTime,
    /// A Live session's cumulative seconds, charged by their increase.
    live: Option<LiveWindows>,
}

/// Where a translation session's audio seconds come from.
#[derive(Debug)]
enum AudioSource {
    /// Measured from the frames (a WebSocket session).
    Measured(Arc<AudioCounters>),
    /// A WebRTC call's connected time.
    Call(Arc<CallClock>),
}

impl MeterTask {
    pub(crate) fn new(
        shared: Arc<Shared>,
        meters: Arc<ModelMeters>,
        meta: SessionMeta,
        rx: mpsc::Receiver<SentRecord>,
        kill: watch::Sender<Option<Kill>>,
    ) -> Self {
        Self {
            meters,
            shared,
            key: meta.key.clone(),
            team: None,
            meta,
            rx,
            kill,
            window: Vec::new(),
            seq: 0,
            queued: Vec::new(),
            lost_usd: 0.0,
            estimate: Vec::new(),
            keyset_seen: None,
            audio: None,
            audio_windows: 0,
            audio_since: SystemTime::now(),
            live: None,
        }
    }

    /// Meters the cumulative seconds a Live session's upstream reports
    /// ([`super::live`]): every flush charges their increase, the last one
    /// the rest of the final figure.
    pub fn measuring_live(mut self, usage: Arc<LiveUsage>) -> Self {
        self.live = Some(LiveWindows::new(usage));
        self
    }

    /// Meters the audio `counters` measure ([`super::translation`]): every
    /// flush takes the window's seconds as one record.
    pub fn measuring_audio(mut self, counters: Arc<AudioCounters>) -> Self {
        self.audio = Some(AudioSource::Measured(counters));
        self
    }

    /// Meters a WebRTC translation call by its connected time
    /// ([`super::call_time`]): every flush takes the window's part of it as
    /// one record, the first window starting at the answer.
    pub fn measuring_call(mut self, clock: Arc<CallClock>) -> Self {
        self.audio_since = clock.answered();
        self.audio = Some(AudioSource::Call(clock));
        self
    }

    /// The window's audio as a record, when it carried any.
    fn take_audio_window(&mut self) {
        let now = SystemTime::now();
        let (input, output) = match &self.audio {
            None => return,
            Some(AudioSource::Measured(counters)) => {
                let (input, output) = counters.take();
                (input, Some(output))
            }
            // A call's output audio is on its media track: not measured.
            Some(AudioSource::Call(clock)) => (clock.billed(self.audio_since, now), None),
        };
        if input <= 0.0 && output.unwrap_or(0.0) <= 0.0 {
            return;
        }
        let started_at = std::mem::replace(&mut self.audio_since, now);
        self.audio_windows += 1;
        self.window.push(TurnRecord {
            n: self.audio_windows,
            kind: TurnKind::Translation {
                output_seconds: output,
            },
            started_at,
            ended_at: now,
            latency: now.duration_since(started_at).unwrap_or_default(),
            ttft: None,
            status: 200,
            end_reason: "window",
            usage: Some(Usage {
                audio_seconds: Some(translation::billed_seconds(
                    input,
                    output.unwrap_or_default(),
                )),
                ..Usage::default()
            }),
            response_id: None,
            conversation_id: None,
        });
    }

    /// Checks the key at once; the future runs until the tracker is
    /// finished (or dropped) and the final flush has been written.
    pub fn run(mut self) -> impl Future<Output = ()> + Send {
        // Subscribed before the first check, so no swap falls between them.
        let mut keys = self.shared.keys.subscribe();
        self.check_key();
        // The interval in force when the session starts is kept for its life.
        let flush_secs = self.shared.config().flush_secs;
        let every_turn = flush_secs == 0;
        let period = if every_turn {
            BUDGET_TICK
        } else {
            Duration::from_secs(flush_secs)
        };
        // An async block, not an `async fn`: an `async fn`'s argument is
        // stored twice in its future (as the argument, then as the local it
        // is moved to), and the meter is most of the future.
        async move {
            let start = Instant::now();
            let mut flush_tick = interval_at(start + period, period);
            flush_tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    rec = self.rx.recv() => match rec {
                        Some(rec) => {
                            self.window.push(*rec);
                            while let Ok(rec) = self.rx.try_recv() {
                                self.window.push(*rec);
                            }
                            if every_turn || self.window.len() >= MAX_WINDOW_TURNS {
                                self.flush_boxed(true).await;
                            }
                        }
                        None => break,
                    },
                    _ = flush_tick.tick() => self.flush_boxed(true).await,
                    Ok(()) = keys.changed() => self.check_key(),
                }
            }
            self.flush_boxed(false).await;
        }
    }

    /// [`Self::flush`] in a box of its own: its state (a store write in
    /// flight) is allocated while it runs, not held in the meter's future
    /// for the session's life, which is mostly idle.
    async fn flush_boxed(&mut self, check_budgets: bool) {
        Box::pin(self.flush(check_budgets)).await
    }

    /// Fires the kill unless one already fired; true if this one did.
    fn fire(&self, kill: Kill) -> bool {
        self.kill.send_if_modified(|k| {
            if k.is_none() {
                *k = Some(kill);
                true
            } else {
                false
            }
        })
    }

    fn check_key(&mut self) {
        let set = self.shared.keys.get();
        if self
            .keyset_seen
            .as_ref()
            .is_some_and(|seen| Arc::ptr_eq(seen, &set))
        {
            return;
        }
        match set.by_id(&self.meta.key.id) {
            // The same key: its id may have been given a new secret (a
            // rotation), which revokes the one this session opened with.
            Some(k) if !k.disabled && k.sha256 == self.meta.key.sha256 => {
                self.key = k.clone();
                self.team = self.meta.team.as_deref().and_then(|t| set.team(t)).cloned();
            }
            found => {
                let why = match found {
                    Some(k) if k.disabled => "disabled",
                    Some(_) => "replaced",
                    None => "removed",
                };
                let message = format!("the API key '{}' of this session was {why}", self.key.id);
                let kill = Kill {
                    code: KILL_CLOSE_CODE,
                    reason: "api key revoked".into(),
                    error_event: Some(error_event(
                        "invalid_request_error",
                        "invalid_api_key",
                        &message,
                    )),
                    outcome: OUTCOME_KEY_REVOKED,
                };
                if self.fire(kill) {
                    tracing::info!(session_id = %self.meta.session_id, key_id = %self.key.id, why, "closing session: key revoked");
                }
            }
        }
        self.keyset_seen = Some(set);
    }

    /// Writes the window. `check_budgets` is false only for the session's
    /// last flush, which also takes a Live session's final figure.
    async fn flush(&mut self, check_budgets: bool) {
        self.check_key();
        self.take_audio_window();
        if let Some(live) = self.live.as_mut() {
            self.window
                .extend(live.take_delegated_marked(!check_budgets).await);
            if let Some(rec) = live.take_marked(!check_budgets).await {
                self.window.push(rec);
            }
        }
        let prices = self.shared.prices();
        let max_turn_usd = self.shared.config().max_turn_usd;
        let mut rows = Vec::with_capacity(self.window.len());
        let mut cost = 0.0;
        let mut tokens: u64 = 0;
        for rec in std::mem::take(&mut self.window) {
            let priced = build_row(&rec, &self.meta, &prices, max_turn_usd);
            if priced.charge.implausible {
                self.implausible(&priced, max_turn_usd);
            }
            if !priced.priced
                && (priced.usage.total > 0 || priced.usage.audio_seconds.is_some())
                && self.shared.first_unpriced(&priced.row.model)
            {
                tracing::warn!(session_id = %self.meta.session_id, model = %priced.row.model, "no [[prices]] row for this model: its usage is logged at cost 0");
            }
            self.record_metrics(&priced.row, &priced.usage);
            if let (Some(trace), TurnKind::Response) = (&self.meta.trace, &rec.kind) {
                trace.turn(&Turn {
                    row: &priced.row,
                    started_at: rec.started_at,
                    ended_at: rec.ended_at,
                    ttft: rec.ttft,
                    response_id: rec.response_id.as_deref(),
                    conversation_id: rec.conversation_id.as_deref(),
                    cached_text: priced.usage.cached_text,
                    cached_audio: priced.usage.cached_audio,
                    cached_image: priced.usage.cached_image,
                });
            }
            cost += priced.row.cost_usd;
            tokens = tokens.saturating_add(priced.charge.tokens);
            rows.push(priced.row);
        }
        self.shared.log.write(&rows);

        let budgets = applicable_budgets(
            &self.key,
            self.team.as_ref(),
            &self.meta.model,
            self.meta.route_budget,
        );
        let mut batch = FlushBatch {
            id: None,
            now: SystemTime::now(),
            charges: budgets.iter().map(|(b, _)| (b.clone(), cost)).collect(),
            tpm: (self.key.tpm.is_some() && tokens > 0)
                .then(|| (self.key.id.clone(), tokens.min(MAX_TPM_INCREMENT))),
            rows,
            stream_maxlen: self.shared.config().stream_maxlen,
        };
        if batch.is_empty() || (batch.counts_nothing() && !self.shared.store.keeps_rows()) {
            // Nothing to count, and no rows for this store to keep.
            return;
        }
        let reply = if batch.is_read_only() {
            // A budget re-read changes nothing: no guard, nothing to keep
            // if it fails, and no need to wait behind the outbox.
            if !check_budgets {
                return;
            }
            match bounded(self.shared.store.flush(&batch), "flush").await {
                Ok(totals) => Some(totals),
                Err(e) => {
                    self.shared.store_error(&e, "budget re-read");
                    None
                }
            }
        } else {
            self.seq += 1;
            batch.id = Some(FlushId {
                session_id: self.meta.session_id.clone(),
                seq: self.seq,
            });
            self.write(batch).await
        };
        let spent = self.estimate_spend(&budgets, reply, cost);
        if check_budgets {
            self.check_budgets(&budgets, &spent);
        }
    }

    /// Writes `batch` to the store, or queues it in the outbox when the
    /// store fails or earlier writes still wait there. The store's budget
    /// totals when it answered.
    async fn write(&mut self, batch: FlushBatch) -> Option<Vec<f64>> {
        let outbox = &self.shared.outbox;
        if !outbox.is_pending() {
            match bounded(self.shared.store.flush(&batch), "flush").await {
                Ok(totals) => return Some(totals),
                // Maybe applied, maybe not: the outbox sends it again and
                // the store's write mark keeps it from counting twice.
                Err(e) => self.shared.store_error(&e, "flush"),
            }
        }
        self.queued.push(outbox.push(batch));
        None
    }

    /// What each budget has spent as far as this meter knows: the store's
    /// totals (when it answered) plus this session's spend that has not
    /// reached the store; else the last estimate plus this flush's cost.
    fn estimate_spend(
        &mut self,
        budgets: &[(BudgetKey, f64)],
        reply: Option<Vec<f64>>,
        cost: f64,
    ) -> Vec<f64> {
        let mut waiting = self.lost_usd;
        self.queued.retain(|q| match q.state() {
            QueuedState::Pending => {
                waiting += q.batch.rows_cost();
                true
            }
            QueuedState::Applied => false,
            QueuedState::Dropped => {
                self.lost_usd += q.batch.rows_cost();
                waiting += q.batch.rows_cost();
                false
            }
        });
        let spent: Vec<f64> = match reply {
            Some(totals) => totals.iter().map(|t| t + waiting).collect(),
            None => budgets
                .iter()
                .map(|(b, _)| {
                    let before = self
                        .estimate
                        .iter()
                        .find(|(e, _)| e == b)
                        .map_or(0.0, |(_, v)| *v);
                    before + cost
                })
                .collect(),
        };
        self.estimate = budgets
            .iter()
            .map(|(b, _)| b.clone())
            .zip(spent.iter().copied())
            .collect();
        spent
    }

    fn check_budgets(&self, budgets: &[(BudgetKey, f64)], totals: &[f64]) {
        let Some(((b, limit), spent)) = budgets
            .iter()
            .zip(totals)
            .find(|((_, limit), spent)| **spent >= *limit)
        else {
            return;
        };
        let message = budget_message(b, *limit);
        let kill = Kill {
            code: KILL_CLOSE_CODE,
            reason: "budget exceeded".into(),
            error_event: Some(error_event(
                "insufficient_quota",
                "insufficient_quota",
                &message,
            )),
            outcome: OUTCOME_BUDGET_EXHAUSTED,
        };
        if self.fire(kill) {
            self.shared
                .metrics
                .budget_blocks
                .get_or_create(&model(&self.meta.model))
                .inc();
            tracing::info!(session_id = %self.meta.session_id, spent_usd = spent, %message, "closing session: budget spent");
        }
    }

    /// A turn whose usage was beyond the plausibility bound: counted and
    /// logged (its row is flagged and its charge capped by [`build_row`]).
    fn implausible(&self, p: &PricedRow, max_turn_usd: f64) {
        self.shared
            .metrics
            .usage_implausible
            .get_or_create(&model(&p.row.model))
            .inc();
        tracing::warn!(
            session_id = %self.meta.session_id,
            request_id = %p.row.request_id,
            key_id = %self.key.id,
            model = %p.row.model,
            total_tokens = p.usage.total,
            max_turn_tokens = pricing::MAX_TURN_TOKENS,
            charged_usd = p.charge.cost_usd,
            max_turn_usd,
            "implausible usage reported upstream: the row keeps it, flagged usage_implausible; charged at most max_turn_usd"
        );
    }

    fn record_metrics(&self, row: &RequestLogRow, u: &Usage) {
        let m = &self.shared.metrics;
        // A transcription turn is labelled with its transcription model:
        // looked up in the families, as the cache holds routes' models only.
        let other;
        let meters = if row.model == self.meters.model() {
            &self.meters
        } else {
            other = ModelMeters::for_model(&row.model);
            &other
        };
        meters.turn(m, row.status);
        // In `metrics::TOKEN_KINDS` order.
        let counts = [
            u.input_text,
            u.input_audio,
            u.input_image,
            u.cached_text,
            u.cached_audio,
            u.output_text,
            u.output_audio,
        ];
        for (kind, n) in counts.into_iter().enumerate() {
            if n > 0 {
                // Bounded like the tpm window: a no-op for a plausible turn.
                meters.tokens(m, kind, n.min(pricing::MAX_TURN_TOKENS));
            }
        }
        if row.cost_usd > 0.0 {
            meters.cost_usd(m, row.cost_usd);
        }
    }
}

/// A row, its normalised usage, whether a price row applied, and what the
/// turn is charged.
#[derive(Debug, Clone, PartialEq)]
pub struct PricedRow {
    pub row: RequestLogRow,
    pub usage: Usage,
    pub priced: bool,
    pub charge: pricing::Charge,
}

/// The request-log row of one turn, priced with `prices`, its charge capped
/// at `max_turn_usd` when its usage is implausible ([`pricing::charge`]).
pub fn build_row(
    rec: &TurnRecord,
    meta: &SessionMeta,
    prices: &[PriceRow],
    max_turn_usd: f64,
) -> PricedRow {
    let (row_model, upstream_model, transcription) = match &rec.kind {
        TurnKind::Response | TurnKind::Translation { .. } | TurnKind::Live { .. } => {
            (meta.model.as_str(), meta.upstream_model.as_str(), false)
        }
        TurnKind::Transcription { model } => {
            let configured = |m: &&str| {
                *m == meta.model || pricing::find(prices, m, m, &meta.upstream).is_some()
            };
            let m = model
                .as_deref()
                .filter(configured)
                .unwrap_or(UNKNOWN_TRANSCRIPTION_MODEL);
            (m, m, true)
        }
        // A delegated response is priced at its own model's rates: the
        // model the Responses backend named, looked up as it is.
        TurnKind::Delegated { model, .. } => (model.as_str(), model.as_str(), false),
    };
    let usage = rec.usage.unwrap_or_default();
    // A row prices a usage only with a rate for its shape (tokens or
    // duration); else the usage is unpriced.
    let price = pricing::find(prices, row_model, upstream_model, &meta.upstream)
        .filter(|p| pricing::prices(p, &usage));
    let cost_usd = price.map_or(0.0, |p| pricing::cost_usd(p, &usage));
    let charge = pricing::charge(&usage, cost_usd, max_turn_usd);
    let rfc3339 = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
    let (request_id, delegation_id) = match &rec.kind {
        // A delegated response's row is named by its response id: unique,
        // and apart from the Live windows' numbers.
        TurnKind::Delegated { delegation_id, .. } => (
            format!(
                "{}:{}",
                meta.session_id,
                rec.response_id.as_deref().unwrap_or_default()
            ),
            delegation_id.clone(),
        ),
        _ => (format!("{}:{}", meta.session_id, rec.n), None),
    };
    let row = RequestLogRow {
        request_id,
        session_id: meta.session_id.clone(),
        key_id: meta.key.id.clone(),
        client_secret_id: meta.client_secret_id.clone(),
        transport: meta.transport.to_string(),
        call_id: meta.call_id.clone(),
        live_session_id: meta.live_session_id.clone(),
        response_id: match rec.kind {
            TurnKind::Delegated { .. } => rec.response_id.clone(),
            _ => None,
        },
        delegation_id,
        team: meta.team.clone(),
        model: row_model.to_string(),
        upstream_model: upstream_model.to_string(),
        provider: meta.provider.to_string(),
        upstream: meta.upstream.clone(),
        started_at: rfc3339(rec.started_at),
        ended_at: rfc3339(rec.ended_at),
        latency_ms: rec.latency.as_millis() as u64,
        ttft_ms: rec.ttft.map(|d| d.as_millis() as u64),
        status: rec.status,
        input_tokens: usage.input,
        output_tokens: usage.output,
        total_tokens: usage.total,
        input_text_tokens: usage.input_text,
        input_audio_tokens: usage.input_audio,
        input_image_tokens: usage.input_image,
        input_cached_tokens: usage.cached(),
        output_text_tokens: usage.output_text,
        output_audio_tokens: usage.output_audio,
        transcription_tokens: if transcription { usage.total } else { 0 },
        audio_seconds: usage.audio_seconds,
        output_audio_seconds: match rec.kind {
            TurnKind::Translation { output_seconds } => output_seconds,
            _ => None,
        },
        cost_usd: charge.cost_usd,
        usage_unknown: rec.usage.is_none(),
        usage_implausible: charge.implausible,
        usage_estimated: matches!(rec.kind, TurnKind::Live { estimated: true }),
        usage_unpriced: price.is_none() && (usage.total > 0 || usage.audio_seconds.is_some()),
        end_reason: rec.end_reason.to_string(),
    };
    PricedRow {
        row,
        usage,
        priced: price.is_some(),
        charge,
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;
    use crate::config::RouteConfig;

    const MAX_TURN_USD: f64 = patchbay_config::DEFAULT_MAX_TURN_USD;

    fn meta() -> SessionMeta {
        let key = KeyEntry {
            id: "k1".into(),
            sha256: String::new(),
            team: Some("support".into()),
            rpm: None,
            tpm: None,
            budget_usd: None,
            budget_period: Default::default(),
            max_sessions: None,
            models: None,
            disabled: false,
        };
        let route = RouteConfig {
            upstream_model: Some("gpt-realtime-2025-08-28".into()),
            ..RouteConfig::default()
        };
        SessionMeta::new("sess1", &key, &route)
    }

    fn record(kind: TurnKind, usage: Option<Usage>) -> TurnRecord {
        let t0 = UNIX_EPOCH + Duration::from_millis(1_735_689_600_000);
        TurnRecord {
            n: 3,
            kind,
            started_at: t0,
            ended_at: t0 + Duration::from_millis(1250),
            latency: Duration::from_millis(1250),
            ttft: Some(Duration::from_millis(310)),
            status: 200,
            end_reason: "completed",
            usage,
            response_id: None,
            conversation_id: None,
        }
    }

    fn prices() -> Vec<PriceRow> {
        vec![
            PriceRow {
                upstream: None,
                model: "gpt-realtime-2025-08-28".into(),
                text_input: 4.0,
                cached_text_input: 0.4,
                audio_input: 32.0,
                cached_audio_input: 0.4,
                text_output: 16.0,
                audio_output: 64.0,
                usd_per_minute: None,
            },
            PriceRow {
                upstream: None,
                model: "gpt-4o-transcribe".into(),
                audio_input: 6.0,
                text_output: 10.0,
                ..PriceRow::default()
            },
        ]
    }

    /// A meter's future is boxed and held for its session's life, idle
    /// most of it: a flush's state (a store write in flight) lives in a box
    /// of its own, only while it runs.
    #[tokio::test]
    async fn a_meters_future_stays_small() {
        let metering = crate::metering::Metering::with_redis(
            &crate::config::Config::default(),
            Arc::new(crate::metrics::Metrics::new()),
            Arc::new(crate::auth::KeyStore::new(Default::default())),
            None,
        );
        let (_tracker, meter, _kill) = metering.start_session(meta());
        let run = meter.run();
        let size = std::mem::size_of_val(&run);
        // 2,536 bytes (debug build) with the flush inline and the meter
        // stored twice (an `async fn` taking it by value).
        assert!(size <= 1200, "a meter's future is {size} bytes");
    }

    #[test]
    fn a_response_row_carries_ids_times_tokens_and_cost() {
        let usage =
            Usage::from_json(&serde_json::from_value(patchbay_sim::usage_for(2, 5)).unwrap());
        let p = build_row(
            &record(TurnKind::Response, Some(usage)),
            &meta(),
            &prices(),
            MAX_TURN_USD,
        );
        let r = &p.row;
        assert!(p.priced);
        assert_eq!(r.request_id, "sess1:3");
        assert_eq!(
            (r.key_id.as_str(), r.team.as_deref()),
            ("k1", Some("support"))
        );
        assert_eq!(r.model, "gpt-realtime");
        assert_eq!(r.upstream_model, "gpt-realtime-2025-08-28");
        assert_eq!(r.provider, "openai");
        assert_eq!(r.started_at, "2025-01-01T00:00:00.000Z");
        assert_eq!(r.ended_at, "2025-01-01T00:00:01.250Z");
        assert_eq!((r.latency_ms, r.ttft_ms), (1250, Some(310)));
        assert_eq!(
            (r.input_tokens, r.output_tokens, r.total_tokens),
            (130, 62, 192)
        );
        assert_eq!(
            (
                r.input_text_tokens,
                r.input_audio_tokens,
                r.input_cached_tokens
            ),
            (30, 100, 64)
        );
        assert_eq!((r.output_text_tokens, r.output_audio_tokens), (12, 50));
        assert_eq!(r.transcription_tokens, 0);
        assert!((r.cost_usd - 0.0046896).abs() < 1e-12, "{}", r.cost_usd);
        assert!(!r.usage_unknown);
    }

    #[test]
    fn an_implausible_usage_keeps_its_figures_in_a_flagged_row_charged_at_most_max_turn_usd() {
        let usage = Usage::from_json(&serde_json::from_value(patchbay_sim::usage_max()).unwrap());
        let p = build_row(
            &record(TurnKind::Response, Some(usage)),
            &meta(),
            &prices(),
            2.5,
        );
        let r = &p.row;
        assert!(r.usage_implausible);
        assert_eq!(
            (r.total_tokens, r.output_audio_tokens),
            (u64::MAX, u64::MAX)
        );
        assert_eq!(r.cost_usd, 2.5);
        assert_eq!(p.charge.tokens, pricing::MAX_TURN_TOKENS);
        let plain =
            Usage::from_json(&serde_json::from_value(patchbay_sim::usage_for(2, 5)).unwrap());
        let p = build_row(
            &record(TurnKind::Response, Some(plain)),
            &meta(),
            &prices(),
            2.5,
        );
        assert!(!p.row.usage_implausible);
        assert_eq!(p.charge.tokens, 192);
    }

    #[test]
    fn a_row_names_the_client_secret_its_session_was_opened_with() {
        let rec = record(TurnKind::Response, None);
        assert_eq!(
            build_row(&rec, &meta(), &prices(), MAX_TURN_USD)
                .row
                .client_secret_id,
            None
        );
        let meta = meta().with_client_secret(Some("cs_0011".into()));
        let r = build_row(&rec, &meta, &prices(), MAX_TURN_USD).row;
        assert_eq!(r.client_secret_id.as_deref(), Some("cs_0011"));
        assert_eq!(r.key_id, "k1", "metered as the parent key");
    }

    #[test]
    fn a_cut_short_row_is_unknown_with_zero_tokens_and_cost() {
        let mut rec = record(TurnKind::Response, None);
        rec.status = 499;
        rec.end_reason = "client_left";
        let r = build_row(&rec, &meta(), &prices(), MAX_TURN_USD).row;
        assert!(r.usage_unknown);
        assert_eq!((r.total_tokens, r.cost_usd, r.status), (0, 0.0, 499));
        assert_eq!(r.end_reason, "client_left");
    }

    #[test]
    fn transcription_rows_are_priced_on_the_transcription_model() {
        let usage = Usage {
            input: 30,
            output: 5,
            total: 35,
            input_audio: 30,
            output_text: 5,
            ..Usage::default()
        };
        let kind = TurnKind::Transcription {
            model: Some("gpt-4o-transcribe".into()),
        };
        let r = build_row(&record(kind, Some(usage)), &meta(), &prices(), MAX_TURN_USD).row;
        assert_eq!(
            (r.model.as_str(), r.upstream_model.as_str()),
            ("gpt-4o-transcribe", "gpt-4o-transcribe")
        );
        assert_eq!(r.transcription_tokens, 35);
        assert!((r.cost_usd - (30.0 * 6.0 + 5.0 * 10.0) / 1e6).abs() < 1e-12);
        let unknown = TurnKind::Transcription { model: None };
        let p = build_row(
            &record(unknown, Some(usage)),
            &meta(),
            &prices(),
            MAX_TURN_USD,
        );
        assert_eq!(p.row.model, UNKNOWN_TRANSCRIPTION_MODEL);
        assert!(!p.priced);
        assert_eq!(p.row.cost_usd, 0.0);
    }

    #[test]
    fn a_transcription_model_without_a_price_row_is_never_a_row_model() {
        let kind = TurnKind::Transcription {
            model: Some("anything-a-client-typed".into()),
        };
        let usage = Usage {
            total: 35,
            ..Usage::default()
        };
        let p = build_row(&record(kind, Some(usage)), &meta(), &prices(), MAX_TURN_USD);
        assert_eq!(p.row.model, UNKNOWN_TRANSCRIPTION_MODEL);
        assert_eq!(p.row.upstream_model, UNKNOWN_TRANSCRIPTION_MODEL);
        assert!(!p.priced);
    }

    #[test]
    fn a_duration_transcription_is_priced_per_minute_and_carries_its_seconds() {
        let mut prices = prices();
        prices.push(PriceRow {
            model: "gpt-realtime-whisper".into(),
            usd_per_minute: Some(0.017),
            ..PriceRow::default()
        });
        let kind = |m: &str| TurnKind::Transcription {
            model: Some(m.into()),
        };
        let usage = Usage {
            audio_seconds: Some(30.0),
            ..Usage::default()
        };
        let p = build_row(
            &record(kind("gpt-realtime-whisper"), Some(usage)),
            &meta(),
            &prices,
            MAX_TURN_USD,
        );
        assert!(p.priced);
        assert_eq!(p.row.model, "gpt-realtime-whisper");
        assert_eq!(p.row.audio_seconds, Some(30.0));
        assert_eq!((p.row.cost_usd, p.row.total_tokens), (0.0085, 0));
        // A duration on a model priced only per token is unpriced: cost 0.
        let p = build_row(
            &record(kind("gpt-4o-transcribe"), Some(usage)),
            &meta(),
            &prices,
            MAX_TURN_USD,
        );
        assert!(!p.priced);
        assert_eq!(p.row.cost_usd, 0.0);
        assert_eq!(p.row.audio_seconds, Some(30.0));
        // A token row has no seconds.
        let r = build_row(
            &record(TurnKind::Response, Some(Usage::default())),
            &meta(),
            &prices,
            MAX_TURN_USD,
        )
        .row;
        assert_eq!(r.audio_seconds, None);
    }
}
