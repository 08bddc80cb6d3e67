//! The accept loop: each connection is a WebSocket upgrade (a Realtime
//! session or a call's sideband) or, on plain TCP, a request of the calls
//! API, told apart by its first bytes.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::config::{SimConfig, TRANSCRIPTION_MODEL};
use crate::handle::SimHandle;
use crate::live::Live;
use crate::realtime::Session;
use crate::translation::Translation;
use crate::upgrade::UpgradeCheck;
use crate::wire::SimIo;
use crate::{calls_api, wire};

/// Binds and serves until [`SimHandle::stop`].
pub async fn start(listen: SocketAddr, config: SimConfig) -> std::io::Result<SimHandle> {
    let listener = wire::bind(listen)?;
    let addr = listener.local_addr()?;
    let (commands, _) = broadcast::channel(16);
    let handle = SimHandle {
        addr,
        stats: Arc::default(),
        commands,
        shutdown: CancellationToken::new(),
    };
    tokio::spawn(accept_loop(listener, Arc::new(config), handle.clone()));
    Ok(handle)
}

async fn accept_loop(listener: TcpListener, config: Arc<SimConfig>, handle: SimHandle) {
    loop {
        let accepted = tokio::select! {
            _ = handle.shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let _ = tcp.set_nodelay(true);
        handle.stats.tcp_accepted.fetch_add(1, Ordering::Relaxed);
        let config = config.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            let shutdown = handle.shutdown.clone();
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = connection(tcp, config, handle) => {}
            }
        });
    }
}

async fn connection(tcp: TcpStream, config: Arc<SimConfig>, handle: SimHandle) {
    if config.tls.is_none() {
        // A WebSocket upgrade is a GET; the calls API is POST (or OPTIONS),
        // and a Live recording's download a GET of `…/content`.
        let mut first = [0u8; 128];
        let peeked = tokio::time::timeout(Duration::from_secs(10), tcp.peek(&mut first)).await;
        let n = match peeked {
            Ok(Ok(n)) => n,
            _ => 0,
        };
        let head = &first[..n];
        let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
        let content = head.starts_with(b"GET ") && line.windows(8).any(|w| w == b"/content");
        if n >= 4 && (head.starts_with(b"POST") || head.starts_with(b"OPTI") || content) {
            calls_api::serve(tcp, config, handle).await;
            return;
        }
    }
    let io: SimIo = match &config.tls {
        Some(tls) => match tokio_rustls::TlsAcceptor::from(tls.clone())
            .accept(tcp)
            .await
        {
            Ok(s) => Either::Right(s),
            Err(_) => return,
        },
        None => Either::Left(tcp),
    };
    if !config.upgrade_delay.is_zero() {
        tokio::time::sleep(config.upgrade_delay).await;
    }
    let mut beta = false;
    let mut transcription = false;
    let mut translation = None;
    let mut live = false;
    let mut live_attach = None;
    let mut live_fork = None;
    let mut call = None;
    let mut slot = false;
    let check = UpgradeCheck {
        config: &config,
        stats: &handle.stats,
        beta: &mut beta,
        transcription: &mut transcription,
        translation: &mut translation,
        live: &mut live,
        live_attach: &mut live_attach,
        live_fork: &mut live_fork,
        call: &mut call,
        slot: &mut slot,
    };
    let ws_config = WebSocketConfig::default()
        .max_message_size(Some(config.max_message_bytes))
        .max_frame_size(Some(config.max_message_bytes));
    let accepted =
        tokio_tungstenite::accept_hdr_async_with_config(io, check, Some(ws_config)).await;
    match accepted {
        Ok(ws) => {
            handle.stats.upgrades.fetch_add(1, Ordering::Relaxed);
            handle.stats.sessions_active.fetch_add(1, Ordering::Relaxed);
            if let Some(id) = live_attach {
                crate::live_webrtc::sideband(ws, id, &config, handle.clone()).await;
                handle.stats.sessions_active.fetch_sub(1, Ordering::Relaxed);
                if slot {
                    handle.stats.limited.fetch_sub(1, Ordering::Relaxed);
                }
                return;
            }
            if live {
                Live::new(config, handle.clone())
                    .forked_from(live_fork)
                    .run(ws)
                    .await;
                handle.stats.sessions_active.fetch_sub(1, Ordering::Relaxed);
                if slot {
                    handle.stats.limited.fetch_sub(1, Ordering::Relaxed);
                }
                return;
            }
            if let Some(model) = translation {
                let mut session = Translation::new(config, handle.clone(), model);
                session.call = call;
                session.run(ws).await;
                handle.stats.sessions_active.fetch_sub(1, Ordering::Relaxed);
                if slot {
                    handle.stats.limited.fetch_sub(1, Ordering::Relaxed);
                }
                return;
            }
            let mut session = Session::new(config, handle.clone(), beta);
            session.transcription = transcription;
            if transcription {
                session.input_transcription =
                    json!({"model": TRANSCRIPTION_MODEL, "language": null, "prompt": ""});
            }
            session.call = call;
            session.run(ws).await;
            handle.stats.sessions_active.fetch_sub(1, Ordering::Relaxed);
        }
        Err(_) => {
            handle.stats.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
    if slot {
        handle.stats.limited.fetch_sub(1, Ordering::Relaxed);
    }
}
