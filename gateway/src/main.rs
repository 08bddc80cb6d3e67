//! `patchbay-gateway`: `serve` (default), `demo`, `sim`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use patchbay_gateway::config::Config;
use patchbay_gateway::sim::{SimConfig, SimFault};
use patchbay_gateway::{demo, drain, gateway, sim};

/// Exit code for configuration errors.
const EXIT_CONFIG: u8 = 2;
/// How long the exit waits for blocking tasks once the drain is done.
const EXIT_GRACE: Duration = Duration::from_millis(500);

#[derive(Parser)]
#[command(name = "patchbay-gateway", version, about = "OpenAI Realtime gateway")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve client sessions (the default).
    Serve {
        /// TOML config; default `patchbay.toml` if present, else built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Start a simulator and a gateway on 127.0.0.1, run a few sessions, keep serving.
    Demo {
        /// Client listen address of the demo gateway (falls back to a free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Sessions to run through the gateway before serving.
        #[arg(long, default_value_t = 3)]
        sessions: usize,
        /// Exit after the sessions instead of serving.
        #[arg(long)]
        once: bool,
    },
    /// Run the simulated OpenAI Realtime upstream.
    Sim {
        #[arg(long, default_value = "127.0.0.1:9100")]
        listen: SocketAddr,
        /// Accepted upstream keys, comma-separated (empty: any key).
        #[arg(long, value_delimiter = ',')]
        keys: Vec<String>,
        #[arg(long, default_value_t = 0)]
        upgrade_delay_ms: u64,
        #[arg(long, default_value_t = 0)]
        session_delay_ms: u64,
        #[arg(long, default_value_t = 0)]
        inference_delay_ms: u64,
        #[arg(long, default_value_t = 5)]
        audio_deltas: usize,
        /// Decoded bytes of audio per delta.
        #[arg(long, default_value_t = 2400)]
        audio_delta_bytes: usize,
        #[arg(long, default_value_t = 0)]
        delta_interval_ms: u64,
        /// `refuse:STATUS`, `error-first`, `drop:N` (after N deltas) or `close:CODE`.
        #[arg(long)]
        fault: Option<String>,
        /// Response turns the simulated caller speaks per call (WebRTC or
        /// SIP), on the call's sideband.
        #[arg(long, default_value_t = 0)]
        caller_turns: usize,
        /// Time before each of the caller's turns.
        #[arg(long, default_value_t = 200)]
        caller_turn_interval_ms: u64,
    },
}

fn parse_fault(s: &str) -> Result<SimFault, String> {
    let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
    let num = |what: &str| -> Result<u64, String> {
        arg.parse()
            .map_err(|_| format!("--fault {kind}:{what} needs a number, got {arg:?}"))
    };
    match kind {
        "refuse" => Ok(SimFault::Refuse {
            status: num("STATUS")? as u16,
        }),
        "error-first" => Ok(SimFault::ErrorFirst),
        "key-error-first" => Ok(SimFault::KeyErrorFirst),
        "drop" => Ok(SimFault::DropMidResponse {
            after_deltas: num("N")? as usize,
        }),
        "close" => Ok(SimFault::CloseAfterResponse {
            code: num("CODE")? as u16,
            reason: "simulated close".into(),
        }),
        _ => Err(format!(
            "unknown --fault {s:?}: use refuse:STATUS, error-first, drop:N or close:CODE"
        )),
    }
}

fn runtime(worker_threads: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder.enable_all().build().map_err(|e| {
        eprintln!("patchbay-gateway: cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = patchbay_gateway::logging::init();
    let code = run(cli);
    // Queued log lines are written before the exit, within a bound.
    logs.flush();
    code
}

fn run(cli: Cli) -> ExitCode {
    match cli.command.unwrap_or(Command::Serve { config: None }) {
        Command::Serve { config } => {
            // The config sizes the runtime, so it is read first.
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("patchbay-gateway: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match runtime(config.server.worker_threads) {
                Ok(rt) => {
                    let code = rt.block_on(serve(config));
                    // Dropping the runtime would wait, unbounded, for
                    // blocking tasks still running: a DNS lookup of a
                    // pool refill stuck on a slow resolver held the exit
                    // far past the drain's wait.
                    rt.shutdown_timeout(EXIT_GRACE);
                    code
                }
                Err(code) => code,
            }
        }
        Command::Demo {
            listen,
            sessions,
            once,
        } => match runtime(0) {
            Ok(rt) => match rt.block_on(demo::run(listen, sessions, once)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("patchbay-gateway demo: {e}");
                    ExitCode::FAILURE
                }
            },
            Err(code) => code,
        },
        Command::Sim {
            listen,
            keys,
            upgrade_delay_ms,
            session_delay_ms,
            inference_delay_ms,
            audio_deltas,
            audio_delta_bytes,
            delta_interval_ms,
            fault,
            caller_turns,
            caller_turn_interval_ms,
        } => {
            let fault = match fault.as_deref().map(parse_fault).transpose() {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("patchbay-gateway sim: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            let config = SimConfig {
                keys,
                upgrade_delay: Duration::from_millis(upgrade_delay_ms),
                session_delay: Duration::from_millis(session_delay_ms),
                inference_delay: Duration::from_millis(inference_delay_ms),
                audio_deltas,
                audio_delta_bytes,
                delta_interval: Duration::from_millis(delta_interval_ms),
                fault,
                caller_turns,
                caller_turn_interval: Duration::from_millis(caller_turn_interval_ms),
                ..SimConfig::default()
            };
            match runtime(0) {
                Ok(rt) => rt.block_on(run_sim(listen, config)),
                Err(code) => code,
            }
        }
    }
}

async fn run_sim(listen: SocketAddr, config: SimConfig) -> ExitCode {
    match sim::start(listen, config).await {
        Ok(handle) => {
            println!("simulator listening on {}", handle.url(false));
            let _ = drain::shutdown_signal().await;
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("patchbay-gateway sim: cannot listen on {listen}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: Config) -> ExitCode {
    let running = match gateway::start(config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("patchbay-gateway: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(e) = drain::shutdown_signal().await {
        tracing::error!(error = %e, "cannot listen for shutdown signals");
        return ExitCode::FAILURE;
    }
    drain::drain(&running.gateway).await;
    ExitCode::SUCCESS
}

/// mimalloc rather than glibc's malloc: a session allocates and frees a
/// buffer per audio frame (tens of KB, past glibc's thread cache), and
/// every row, log line and parsed event; in one interleaved run the gateway
/// used about 4 % less CPU per session with it, for about 9 MB more RSS at
/// start and 5 KB more per idle session (`benchmarks/README.md`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
