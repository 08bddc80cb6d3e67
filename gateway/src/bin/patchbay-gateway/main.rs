//! `patchbay-gateway`: `serve` (default), `check`, `print-config`, `keys
//! new`, `demo`, `sim`; each command but `serve` in a file of its own. The demo and the
//! simulator (`patchbay-sim`) belong to this binary, not to the gateway's
//! library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use patchbay_gateway::config::Config;
use patchbay_gateway::{bootstrap, drain};
use patchbay_sim::cli::SimArgs;

mod check;
mod demo;
mod keys;
mod print_config;

/// Exit code for configuration errors.
pub(crate) const EXIT_CONFIG: u8 = 2;
/// How long the exit waits for blocking tasks once the drain is done.
const EXIT_GRACE: Duration = Duration::from_millis(500);

#[derive(Parser)]
#[command(name = "patchbay-gateway", version, about = "OpenAI Realtime gateway")]
struct Cli {
    /// TOML config for `serve` when no command is given (as `serve --config`).
    #[arg(long)]
    config: Option<PathBuf>,
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
    /// Load everything `serve` would (config, keys, prices, CA and key
    /// files) without listening or dialling, and print what would be served.
    Check {
        /// TOML config; default `patchbay.toml` if present, else built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print the config with its environment overrides as TOML, secrets redacted.
    PrintConfig {
        /// TOML config; default `patchbay.toml` if present, else built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Client keys.
    #[command(subcommand)]
    Keys(KeysCommand),
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
    /// Run the simulated OpenAI Realtime upstream (as `patchbay-sim`).
    Sim(SimArgs),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Generate a client key: printed once, with its `[[keys]]` block.
    New {
        /// The key's id (in logs, rows and metrics).
        #[arg(long)]
        id: String,
        /// The team it belongs to.
        #[arg(long)]
        team: Option<String>,
    },
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
    let command = match (cli.command, cli.config) {
        (None, config) | (Some(Command::Serve { config: None }), config) => {
            Command::Serve { config }
        }
        (Some(command), None) => command,
        (Some(_), Some(_)) => {
            eprintln!(
                "patchbay-gateway: give --config after the command (`patchbay-gateway serve --config F`)"
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match command {
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
        Command::Check { config } => check::run(config.as_deref()),
        Command::PrintConfig { config } => print_config::run(config.as_deref()),
        Command::Keys(KeysCommand::New { id, team }) => keys::new(&id, team.as_deref()),
        Command::Sim(args) => patchbay_sim::cli::run("patchbay-gateway sim", &args),
    }
}

async fn serve(config: Config) -> ExitCode {
    let running = match bootstrap::start(config).await {
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
