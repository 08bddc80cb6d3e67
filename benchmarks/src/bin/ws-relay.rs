//! `ws-relay LISTEN UPSTREAM`: see [`patchbay_bench::ws_relay`]. The keys
//! come from the environment (`WS_RELAY_CLIENT_KEY`, `WS_RELAY_UPSTREAM_KEY`)
//! so that they stay out of `ps`.

use std::net::SocketAddr;
use std::process::ExitCode;

use patchbay_bench::ws_relay::{self, WsRelay};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, upstream) = match args.as_slice() {
        [l, u] => match (l.parse::<SocketAddr>(), u.parse::<SocketAddr>()) {
            (Ok(l), Ok(u)) => (l, u),
            _ => return usage("LISTEN and UPSTREAM must be IP:PORT"),
        },
        _ => return usage("expected two arguments"),
    };
    let key = |name: &str| std::env::var(name).ok().filter(|k| !k.is_empty());
    let (Some(client_key), Some(upstream_key)) =
        (key("WS_RELAY_CLIENT_KEY"), key("WS_RELAY_UPSTREAM_KEY"))
    else {
        return usage("set WS_RELAY_CLIENT_KEY and WS_RELAY_UPSTREAM_KEY");
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ws-relay: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => {
                let relay = WsRelay {
                    upstream,
                    client_key,
                    upstream_key,
                };
                ws_relay::serve(listener, relay).await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ws-relay: cannot listen on {listen}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn usage(why: &str) -> ExitCode {
    eprintln!("ws-relay: {why}\nusage: WS_RELAY_CLIENT_KEY=… WS_RELAY_UPSTREAM_KEY=… ws-relay LISTEN_ADDR UPSTREAM_ADDR");
    ExitCode::from(2)
}
