//! The live status page on the admin listener (`GET /status`): routes with
//! their sessions, warm pools against their targets and upstream breakers;
//! turns and spend, in total and over the last minutes; the store, the
//! outbox and the drain.
//!
//! Its numbers are read back from the exposition `/metrics` serves
//! ([`Exposition`], parsed from [`crate::metrics::Metrics::encode`]), so the
//! page and a scrape never disagree; only what no family holds (pool
//! targets, readiness, the drain, whether a store is configured) comes from
//! the gateway itself. The page is one HTML document with inline CSS and no
//! script: nothing is fetched at run time, and it refreshes itself every
//! [`REFRESH_SECS`] with a `<meta http-equiv="refresh">`.
//!
//! "Last minutes" are differences between samples of each route's turn and
//! spend counters that [`History`] takes every [`SAMPLE_EVERY`] and keeps for
//! [`WINDOW`]; a gateway younger than that shows the time it has.
//!
//! Caveat: the request-log rows are not shown. They are written by the
//! meter and the outbox, which hand them to no one else; the page says
//! where they go (stdout, and the Redis stream with a store).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gateway::Gateway;

/// The page reloads itself this often.
pub const REFRESH_SECS: u64 = 5;
/// How often [`History`] samples the counters.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// The "last minutes" of the page.
pub const WINDOW: Duration = Duration::from_secs(300);

/// One sample line of the text exposition: a name, its labels, a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// The samples of one `/metrics` answer.
#[derive(Debug, Default)]
pub struct Exposition(pub Vec<Sample>);

impl Exposition {
    /// Parses the text format `prometheus-client` writes (`# ` lines are
    /// skipped; label values are quoted, with `\\`, `\"` and `\n` escapes).
    pub fn parse(text: &str) -> Self {
        Self(text.lines().filter_map(parse_line).collect())
    }

    /// The sum of `name`'s samples whose labels include every `(k, v)` of
    /// `matching`; 0 when there is none.
    pub fn sum(&self, name: &str, matching: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                matching
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            // From +0.0: an empty f64 `sum()` is -0.0, shown as "-0".
            .fold(0.0, |total, s| total + s.value)
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut r) = rest.strip_prefix('{') {
        loop {
            r = r.trim_start_matches([',', ' ']);
            if let Some(after) = r.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = r.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((key.to_string(), value));
            r = &after[end + 1..];
        }
    }
    Some(Sample {
        name: line[..name_end].to_string(),
        labels,
        value: first_number(rest)?,
    })
}

fn first_number(s: &str) -> Option<f64> {
    s.split_whitespace().next()?.parse().ok()
}

/// Each route's (turns, spend in USD), by model.
pub type RouteTotals = HashMap<String, (f64, f64)>;

/// Samples of each route's (turns, spend in USD) totals, for the window.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<(Instant, RouteTotals)>>,
}

impl History {
    /// Records the totals seen at `now`, dropping samples older than the
    /// window (one older sample is kept as the window's start).
    pub fn record(&self, now: Instant, totals: RouteTotals) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        s.push_back((now, totals));
        while s.len() > 2 && s.get(1).is_some_and(|(t, _)| now - *t >= WINDOW) {
            s.pop_front();
        }
    }

    /// Each route's (turns, spend) since the oldest sample within the
    /// window, and how long that is; an empty history has nothing.
    pub fn since_window(&self, now: Instant, totals: &RouteTotals) -> (RouteTotals, Duration) {
        let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let Some((at, start)) = s.iter().find(|(t, _)| now - *t <= WINDOW).or(s.back()) else {
            return (HashMap::new(), Duration::ZERO);
        };
        let delta = totals
            .iter()
            .map(|(model, (turns, usd))| {
                let (t0, u0) = start.get(model).copied().unwrap_or((0.0, 0.0));
                (model.clone(), ((turns - t0).max(0.0), (usd - u0).max(0.0)))
            })
            .collect();
        (delta, now - *at)
    }
}

/// Each route's (turns, spend) totals in `e`.
pub fn route_totals(e: &Exposition, models: &[String]) -> RouteTotals {
    models
        .iter()
        .map(|m| {
            let l = [("model", m.as_str())];
            let totals = (
                e.sum("patchbay_turns_total", &l),
                e.sum("patchbay_cost_usd_total", &l),
            );
            (m.clone(), totals)
        })
        .collect()
}

/// What the gateway knows that no metric family holds.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayState {
    pub ready: bool,
    pub draining: bool,
    pub store: bool,
    pub max_sessions: usize,
    /// Each route's model, pool target and upstream names, in config order.
    pub routes: Vec<(String, usize, Vec<String>)>,
}

impl GatewayState {
    pub fn of(gw: &Gateway) -> Self {
        Self {
            ready: gw.is_ready(),
            draining: gw.sessions.is_draining(),
            store: gw.redis.is_some(),
            max_sessions: gw.config.limits.max_sessions,
            routes: gw
                .routes
                .iter()
                .map(|r| {
                    let names = r.upstreams.iter().map(|u| u.name().to_string()).collect();
                    (r.config.model.clone(), r.pool_size(), names)
                })
                .collect(),
        }
    }

    pub fn models(&self) -> Vec<String> {
        self.routes.iter().map(|(m, _, _)| m.clone()).collect()
    }
}

/// The page: `e` is the exposition of this moment, `recent` each route's
/// (turns, spend) over the last `window`.
pub fn render(
    state: &GatewayState,
    e: &Exposition,
    recent: &RouteTotals,
    window: Duration,
) -> String {
    let mut h = String::with_capacity(8192);
    let (status, class) = match (state.draining, state.ready) {
        (true, _) => ("draining", "bad"),
        (false, true) => ("ready", "ok"),
        (false, false) => ("not ready", "warn"),
    };
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>Patchbay gateway: {status}</title><style>{CSS}</style></head><body>\
         <h1>Patchbay gateway <span class=\"{class}\" data-id=\"state\">{status}</span></h1>\
         <p class=\"dim\">Refreshes every {REFRESH_SECS} s. Numbers are those of \
         <a href=\"/metrics\">/metrics</a>; \"last {}\" is the last {} of samples.</p>",
        minutes(WINDOW),
        minutes(window),
    );
    let active = e.sum("patchbay_realtime_sessions_active", &[]);
    h.push_str(
        "<h2>Routes</h2><table><tr><th>route</th><th>live sessions</th>\
                <th>warm sockets / target</th><th>upstreams</th><th>turns</th>\
                <th>spend (USD)</th>",
    );
    let _ = write!(
        h,
        "<th>turns, last {0}</th><th>spend, last {0}</th></tr>",
        minutes(window)
    );
    for (model, target, upstreams) in &state.routes {
        let l = [("model", model.as_str())];
        let m = esc(model);
        let (turns_recent, usd_recent) = recent.get(model).copied().unwrap_or_default();
        let _ = write!(
            h,
            "<tr data-model=\"{m}\"><td>{m}</td>\
             <td data-id=\"sessions\">{}</td>\
             <td><span data-id=\"warm\">{}</span> / <span data-id=\"target\">{target}</span></td><td>",
            num(e.sum("patchbay_realtime_sessions_active", &l)),
            num(e.sum("patchbay_pool_warm_sockets", &l)),
        );
        for name in upstreams {
            let open = e.sum(
                "patchbay_upstream_circuit_open",
                &[("model", model.as_str()), ("upstream", name.as_str())],
            ) > 0.0;
            let (word, class) = if open {
                ("open", "bad")
            } else {
                ("closed", "ok")
            };
            let _ = write!(
                h,
                "<div data-upstream=\"{0}\">{0}: <span class=\"{class}\">breaker {word}</span></div>",
                esc(name)
            );
        }
        let _ = write!(
            h,
            "</td><td data-id=\"turns\">{}</td><td data-id=\"spend\">{}</td>\
             <td data-id=\"turns-recent\">{}</td><td data-id=\"spend-recent\">{}</td></tr>",
            num(e.sum("patchbay_turns_total", &l)),
            usd(e.sum("patchbay_cost_usd_total", &l)),
            num(turns_recent),
            usd(usd_recent),
        );
    }
    let _ = write!(
        h,
        "</table><p><span data-id=\"sessions-total\">{}</span> live sessions of at most \
         {} ([limits] max_sessions).</p>",
        num(active),
        state.max_sessions
    );
    h.push_str("<h2>Store and rows</h2><table>");
    let store = if state.store {
        "Redis"
    } else {
        "none (this process counts alone)"
    };
    let rows = [
        ("store", "store", store.to_string()),
        (
            "store-errors",
            "failed or timed-out store calls",
            num(e.sum("patchbay_store_errors_total", &[])),
        ),
        (
            "outbox-store",
            "rows waiting for Redis",
            num(e.sum("patchbay_outbox_rows", &[("sink", "store")])),
        ),
        (
            "outbox-stdout",
            "rows waiting for stdout",
            num(e.sum("patchbay_outbox_rows", &[("sink", "stdout")])),
        ),
        (
            "outbox-dropped",
            "rows dropped",
            num(e.sum("patchbay_outbox_dropped_total", &[])),
        ),
    ];
    for (id, name, value) in &rows {
        let _ = write!(
            h,
            "<tr><th>{name}</th><td data-id=\"{id}\">{}</td></tr>",
            esc(value)
        );
    }
    h.push_str(
        "</table><p class=\"dim\">Request-log rows (key ids, never keys) go to the gateway's \
         stdout and, with a store, to the Redis stream <code>patchbay:request_logs</code>.</p>\
         </body></html>\n",
    );
    h
}

const CSS: &str = "body{font:14px system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.3em .6em;\
text-align:left;vertical-align:top}th{background:#f4f4f4}.ok{color:#176b2c}.warn{color:#8a5a00}\
.bad{color:#b00020;font-weight:bold}.dim{color:#666}h1 span{font-size:.7em}";

fn minutes(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 120 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

fn num(v: f64) -> String {
    format!("{}", v)
}

fn usd(v: f64) -> String {
    format!("{v:.6}")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page of `gw` now, with `history`'s window.
pub fn page(gw: &Gateway, history: &History) -> String {
    let state = GatewayState::of(gw);
    let e = Exposition::parse(&gw.metrics.encode());
    let totals = route_totals(&e, &state.models());
    let (recent, window) = history.since_window(Instant::now(), &totals);
    render(&state, &e, &recent, window)
}

/// Samples `gw`'s route totals into `history` every [`SAMPLE_EVERY`], for
/// as long as the process runs.
pub fn spawn_sampler(gw: Arc<Gateway>, history: Arc<History>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let e = Exposition::parse(&gw.metrics.encode());
            let models = GatewayState::of(&gw).models();
            history.record(Instant::now(), route_totals(&e, &models));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP patchbay_turns Response turns metered, by status.\n\
        # TYPE patchbay_turns counter\n\
        patchbay_turns_total{model=\"m\",status=\"200\"} 3\n\
        patchbay_turns_total{model=\"m\",status=\"499\"} 1\n\
        patchbay_turns_total{model=\"a,b=\\\"c\\\"\",status=\"200\"} 2\n\
        patchbay_cost_usd_total{model=\"m\"} 0.25\n\
        patchbay_store_errors_total 7\n\
        patchbay_realtime_sessions_active{model=\"m\"} 2\n\
        patchbay_pool_warm_sockets{model=\"m\",upstream=\"u1\"} 1\n\
        patchbay_pool_warm_sockets{model=\"m\",upstream=\"u2\"} 2\n\
        patchbay_upstream_circuit_open{model=\"m\",upstream=\"u2\"} 1\n\
        # EOF\n";

    #[test]
    fn the_exposition_is_read_back_with_labels_escapes_and_sums() {
        let e = Exposition::parse(TEXT);
        assert_eq!(e.sum("patchbay_turns_total", &[("model", "m")]), 4.0);
        assert_eq!(e.sum("patchbay_turns_total", &[]), 6.0);
        assert_eq!(
            e.sum("patchbay_turns_total", &[("model", "a,b=\"c\"")]),
            2.0
        );
        assert_eq!(e.sum("patchbay_store_errors_total", &[]), 7.0);
        assert_eq!(usd(e.sum("patchbay_no_such_total", &[])), "0.000000");
        assert_eq!(e.0.len(), 9);
    }

    #[test]
    fn the_window_counts_from_the_oldest_sample_within_it() {
        let h = History::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let totals = |t: f64, u: f64| HashMap::from([("m".to_string(), (t, u))]);
        assert_eq!(h.since_window(t0, &totals(1.0, 1.0)).1, Duration::ZERO);
        h.record(t0, totals(0.0, 0.0));
        h.record(at(200), totals(10.0, 1.0));
        h.record(at(400), totals(30.0, 2.0));
        let (recent, window) = h.since_window(at(410), &totals(31.0, 2.5));
        assert_eq!(window, Duration::from_secs(210));
        assert_eq!(recent["m"], (21.0, 1.5));
        // Old samples go, one before the window stays.
        h.record(at(900), totals(40.0, 3.0));
        assert_eq!(h.samples.lock().unwrap().len(), 2);
    }

    #[test]
    fn the_page_shows_each_route_its_upstreams_and_the_drain() {
        let state = GatewayState {
            ready: false,
            draining: true,
            store: false,
            max_sessions: 1000,
            routes: vec![("m".into(), 3, vec!["u1".into(), "u2".into()])],
        };
        let recent = HashMap::from([("m".to_string(), (2.0, 0.125))]);
        let page = render(
            &state,
            &Exposition::parse(TEXT),
            &recent,
            Duration::from_secs(300),
        );
        for part in [
            "<meta http-equiv=\"refresh\" content=\"5\">",
            "data-id=\"state\">draining</span>",
            "<td data-id=\"sessions\">2</td>",
            "<span data-id=\"warm\">3</span> / <span data-id=\"target\">3</span>",
            "<div data-upstream=\"u1\">u1: <span class=\"ok\">breaker closed</span></div>",
            "<div data-upstream=\"u2\">u2: <span class=\"bad\">breaker open</span></div>",
            "<td data-id=\"turns\">4</td><td data-id=\"spend\">0.250000</td>",
            "<td data-id=\"turns-recent\">2</td><td data-id=\"spend-recent\">0.125000</td>",
            "turns, last 5 min",
            "<td data-id=\"store-errors\">7</td>",
        ] {
            assert!(page.contains(part), "{part} not in {page}");
        }
        assert!(!page.contains("<script"), "{page}");
    }

    #[test]
    fn a_route_name_is_escaped() {
        let state = GatewayState {
            ready: true,
            draining: false,
            store: true,
            max_sessions: 1,
            routes: vec![("<b>".into(), 0, vec![])],
        };
        let page = render(
            &state,
            &Exposition::default(),
            &HashMap::new(),
            Duration::ZERO,
        );
        assert!(page.contains("<td>&lt;b&gt;</td>"), "{page}");
        assert!(page.contains(">ready</span>"), "{page}");
    }
}
