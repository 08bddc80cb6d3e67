//! The `main` shared by the floor binaries (`tcp-relay`, `ws-relay`):
//! argument parsing, the runtime, the listener, and their errors.

use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// Parses `LISTEN UPSTREAM` from the command line, binds LISTEN on a
/// multi-thread runtime and runs `serve(listener, upstream)`. `usage` is
/// the command's usage line; errors go to stderr prefixed with `name`.
pub fn run<F, Fut>(name: &str, usage: &str, serve: F) -> ExitCode
where
    F: FnOnce(TcpListener, SocketAddr) -> Fut,
    Fut: Future<Output = ()>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, upstream) = match args.as_slice() {
        [l, u] => match (l.parse::<SocketAddr>(), u.parse::<SocketAddr>()) {
            (Ok(l), Ok(u)) => (l, u),
            _ => return fail(name, usage, "LISTEN and UPSTREAM must be IP:PORT"),
        },
        _ => return fail(name, usage, "expected two arguments"),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match TcpListener::bind(listen).await {
            Ok(listener) => {
                // SIGTERM ends the relay by returning from `main` (exit 0,
                // atexit handlers run), so an instrumented build writes its
                // profile (benchmarks/README.md, the profile-guided build).
                match signal(SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            () = serve(listener, upstream) => {}
                            _ = term.recv() => {}
                        }
                    }
                    Err(e) => {
                        eprintln!("{name}: SIGTERM not handled ({e}): it ends the process at once");
                        serve(listener, upstream).await;
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{name}: cannot listen on {listen}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Prints `why` and the usage line; exit code 2.
pub fn fail(name: &str, usage: &str, why: &str) -> ExitCode {
    eprintln!("{name}: {why}\nusage: {usage}");
    ExitCode::from(2)
}
