//! `patchbay-gateway demo`: the whole path on one machine, no OpenAI key.
//!
//! Starts the simulator (with OpenAI-like delays) and a gateway in front of
//! it on 127.0.0.1, runs a few sessions through the gateway, prints their
//! phase timings and the events seen, then keeps serving so an openai SDK
//! client can connect, until Ctrl-C.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use patchbay_gateway::config::Config;
use patchbay_gateway::event::event_type;
use patchbay_gateway::{bootstrap, drain};
use patchbay_sim::{self as sim, SimConfig};

/// The demo's client key (printed; not a secret).
pub const DEMO_CLIENT_KEY: &str = "pb-demo-key";
const DEMO_UPSTREAM_KEY: &str = "sk-sim-demo";
const PHASE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("session {n}: {message}")]
    Session { n: usize, message: String },
}

/// Phase timings of one demo session.
#[derive(Debug, Default)]
pub struct Phases {
    pub dial: Duration,
    pub session: Duration,
    pub first_audio: Duration,
    pub total: Duration,
    pub events: BTreeMap<String, usize>,
}

pub async fn run(listen: SocketAddr, sessions: usize, once: bool) -> Result<(), DemoError> {
    let sim = sim::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        SimConfig {
            keys: vec![DEMO_UPSTREAM_KEY.into()],
            upgrade_delay: Duration::from_millis(50),
            session_delay: Duration::from_millis(7),
            inference_delay: Duration::from_millis(120),
            audio_deltas: 8,
            ..SimConfig::default()
        },
    )
    .await
    .map_err(|e| DemoError::Setup(format!("cannot start the simulator: {e}")))?;

    let toml = format!(
        "[server]\nlisten = \"{listen}\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [[routes]]\nmodel = \"gpt-realtime\"\nupstream_url = \"{}\"\napi_key_env = \"DEMO_UPSTREAM_KEY\"\n\
         [[prices]]\nmodel = \"gpt-realtime\"\ntext_input = 4.0\ncached_text_input = 0.4\n\
         audio_input = 32.0\ncached_audio_input = 0.4\ntext_output = 16.0\naudio_output = 64.0\n\
         [[routes]]\nmodel = \"gpt-live-1\"\nendpoint = \"live\"\n\
         upstream_url = \"ws://{}/v1/live/sessions\"\napi_key_env = \"DEMO_UPSTREAM_KEY\"\n\
         [[prices]]\nmodel = \"gpt-live-1\"\nusd_per_minute = 0.05\n",
        sim.url(false),
        sim.addr
    );
    let env = |k: &str| match k {
        "DEMO_UPSTREAM_KEY" => Some(DEMO_UPSTREAM_KEY.to_string()),
        patchbay_gateway::config::MASTER_KEY_ENV => Some(DEMO_CLIENT_KEY.to_string()),
        _ => None,
    };
    let mut config =
        Config::from_toml_with_env(&toml, &env).map_err(|e| DemoError::Setup(e.to_string()))?;
    let running = match bootstrap::start(config.clone()).await {
        Ok(r) => r,
        Err(patchbay_gateway::gateway::StartError::Bind { .. }) => {
            // The default port is taken: any free port will do for a demo,
            // and the demo says which (the snippet below prints it too).
            config.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
            let running = bootstrap::start(config)
                .await
                .map_err(|e| DemoError::Setup(e.to_string()))?;
            println!(
                "{listen} is taken: the demo gateway listens on {} instead",
                running.addr
            );
            running
        }
        Err(e) => return Err(DemoError::Setup(e.to_string())),
    };
    let addr = running.addr;
    println!("simulated upstream: {}", sim.url(false));
    println!(
        "gateway:            ws://{addr}/v1/realtime   admin: http://{}/metrics",
        running.admin_addr
    );
    println!("status page:        http://{}/status", running.admin_addr);
    println!();
    println!("request-log rows (stdout, one JSON line per metered turn):");
    let mut events = BTreeMap::new();
    let mut phases = Vec::with_capacity(sessions);
    for n in 1..=sessions {
        let p = one_session(addr, n).await?;
        for (k, v) in &p.events {
            *events.entry(k.clone()).or_insert(0) += v;
        }
        phases.push(p);
    }
    // Let the last session's meter write its row before the summary.
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!();
    println!(
        "{:>3}  {:>8}  {:>10}  {:>14}  {:>9}",
        "#", "dial ms", "session ms", "first audio ms", "total ms"
    );
    for (i, p) in phases.iter().enumerate() {
        println!(
            "{:>3}  {:>8.1}  {:>10.1}  {:>14.1}  {:>9.1}",
            i + 1,
            ms(p.dial),
            ms(p.session),
            ms(p.first_audio),
            ms(p.total)
        );
    }
    println!();
    println!("events received through the gateway:");
    for (k, v) in &events {
        println!("  {v:>4}  {k}");
    }
    println!();
    println!("dial = TCP + WebSocket upgrade; session = upgrade → session.created");
    println!("(the first session dialled the upstream; later ones took warm sockets);");
    println!("first audio = response.create → first response.output_audio.delta.");
    if once {
        drain::drain(&running.gateway).await;
        sim.stop();
        return Ok(());
    }
    println!();
    println!("The gateway keeps serving. Connect with the openai Python SDK");
    println!("(pip install \"openai[realtime]\": the Realtime client needs the extra):");
    println!();
    println!("    from openai import OpenAI");
    println!(
        "    client = OpenAI(api_key=\"{DEMO_CLIENT_KEY}\", websocket_base_url=\"ws://{addr}/v1\")"
    );
    println!("    with client.realtime.connect(model=\"gpt-realtime\") as conn:");
    println!("        conn.response.create()");
    println!("        for event in conn:");
    println!("            print(event.type)");
    println!("            if event.type == \"response.done\": break");
    println!();
    println!("Ctrl-C to stop.");
    drain::shutdown_signal()
        .await
        .map_err(|e| DemoError::Setup(e.to_string()))?;
    drain::drain(&running.gateway).await;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn one_session(addr: SocketAddr, n: usize) -> Result<Phases, DemoError> {
    let err = |message: String| DemoError::Session { n, message };
    let t0 = Instant::now();
    let mut request = format!("ws://{addr}/v1/realtime?model=gpt-realtime")
        .into_client_request()
        .map_err(|e| err(e.to_string()))?;
    request.headers_mut().insert(
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer pb-demo-key"),
    );
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| err(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let (mut ws, _) =
        tokio::time::timeout(PHASE_TIMEOUT, tokio_tungstenite::client_async(request, tcp))
            .await
            .map_err(|_| err("upgrade timed out".into()))?
            .map_err(|e| err(format!("upgrade failed: {e}")))?;
    let mut p = Phases {
        dial: t0.elapsed(),
        ..Phases::default()
    };
    let t1 = Instant::now();
    let mut t_create = None;
    let mut sent_create = false;
    loop {
        let msg = tokio::time::timeout(PHASE_TIMEOUT, ws.next())
            .await
            .map_err(|_| err("timed out waiting for events".into()))?;
        let text = match msg {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Close(f))) => return Err(err(format!("closed early: {f:?}"))),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(err(e.to_string())),
            None => return Err(err("connection ended early".into())),
        };
        let kind = event_type(&text)
            .map(|t| t.into_owned())
            .unwrap_or_default();
        *p.events.entry(kind.clone()).or_insert(0) += 1;
        match kind.as_str() {
            "session.created" if !sent_create => {
                p.session = t1.elapsed();
                let send = |v: serde_json::Value| Message::text(v.to_string());
                ws.send(send(serde_json::json!({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})))
                    .await
                    .map_err(|e| err(e.to_string()))?;
                ws.send(send(serde_json::json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}})))
                    .await
                    .map_err(|e| err(e.to_string()))?;
                t_create = Some(Instant::now());
                ws.send(send(serde_json::json!({"type": "response.create"})))
                    .await
                    .map_err(|e| err(e.to_string()))?;
                sent_create = true;
            }
            "response.output_audio.delta" | "response.audio.delta" if p.first_audio.is_zero() => {
                p.first_audio = t_create.map(|t| t.elapsed()).unwrap_or_default();
            }
            "response.done" => break,
            "error" => return Err(err(format!("error event: {text}"))),
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    p.total = t0.elapsed();
    Ok(p)
}
