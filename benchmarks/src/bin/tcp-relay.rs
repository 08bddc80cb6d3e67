//! `tcp-relay LISTEN UPSTREAM`: see [`patchbay_bench::tcp_relay`].

use std::net::SocketAddr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, upstream) = match args.as_slice() {
        [l, u] => match (l.parse::<SocketAddr>(), u.parse::<SocketAddr>()) {
            (Ok(l), Ok(u)) => (l, u),
            _ => return usage("LISTEN and UPSTREAM must be IP:PORT"),
        },
        _ => return usage("expected two arguments"),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tcp-relay: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => {
                patchbay_bench::tcp_relay::serve(listener, upstream).await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tcp-relay: cannot listen on {listen}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn usage(why: &str) -> ExitCode {
    eprintln!("tcp-relay: {why}\nusage: tcp-relay LISTEN_ADDR UPSTREAM_ADDR");
    ExitCode::from(2)
}
