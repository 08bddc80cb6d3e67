//! `patchbay-operator`: `run` the controller, print the `crd`, or `render` a route's children
//! offline.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser, Subcommand, ValueEnum};
use kube::Client;
use patchbay_operator::leader::{self, LeaderElector};
use patchbay_operator::metrics::Metrics;
use patchbay_operator::render::RenderInput;
use patchbay_operator::{controller, deletion_cost};
use patchbay_operator::{crd, http, Context};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "patchbay-operator",
    version,
    about = "Kubernetes operator for Patchbay RealtimeRoutes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller.
    Run(RunArgs),
    /// Print the RealtimeRoute CustomResourceDefinition as YAML.
    Crd,
    /// Print the objects the operator would apply for the routes in a file, as YAML, without
    /// an API server (exit 2 on a file it cannot render).
    Render(RenderArgs),
}

#[derive(clap::Args, Debug)]
struct RenderArgs {
    /// File with one or more RealtimeRoutes (other kinds are skipped); `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
    /// Namespace of a route that names none.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// Gateway image for routes that do not set spec.gateway.image.
    #[arg(
        long,
        env = "PATCHBAY_GATEWAY_IMAGE",
        default_value = DEFAULT_GATEWAY_IMAGE
    )]
    gateway_image: String,
}

/// The gateway image of a route that names none, unless `--gateway-image` says otherwise.
const DEFAULT_GATEWAY_IMAGE: &str = "patchbay/gateway:0.1.0";
/// Exit code of `render` for a file it cannot read or render.
const EXIT_BAD_INPUT: u8 = 2;

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Gateway image for routes that do not set spec.gateway.image.
    #[arg(
        long,
        env = "PATCHBAY_GATEWAY_IMAGE",
        default_value = DEFAULT_GATEWAY_IMAGE
    )]
    gateway_image: String,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "PATCHBAY_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Address of the /metrics and /healthz endpoint.
    #[arg(
        long,
        env = "PATCHBAY_OPERATOR_METRICS_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    metrics_listen: SocketAddr,
    /// Elect a leader through a Lease before reconciling (for more than one replica).
    #[arg(
        long,
        env = "PATCHBAY_LEADER_ELECTION",
        action = ArgAction::Set,
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        value_parser = BoolishValueParser::new(),
    )]
    leader_election: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "PATCHBAY_LEASE_NAME", default_value = "patchbay-operator")]
    lease_name: String,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Log format.
    #[arg(long, env = "PATCHBAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", crd::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Render(args) => render(&args),
        Command::Run(args) => {
            init_tracing(args.log_format);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    tracing::error!("{message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `render`: the file's routes' children on stdout, or why not on stderr with exit 2.
fn render(args: &RenderArgs) -> ExitCode {
    let shown = args.file.display();
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(&args.file)
    };
    let text = match text {
        Ok(text) => text,
        Err(e) => {
            eprintln!("patchbay-operator render: cannot read {shown}: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let input = RenderInput {
        namespace: &args.namespace,
        default_image: &args.gateway_image,
    };
    match patchbay_operator::render::render(&text, &input) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("patchbay-operator render: {shown}: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The identity in the Lease: `POD_NAME`, else the hostname.
fn holder_identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| hostname::get().ok().and_then(|h| h.into_string().ok()))
        .unwrap_or_else(|| "patchbay-operator".into())
}

async fn run(args: RunArgs) -> Result<(), String> {
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));

    let metrics = Metrics::default();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let listener = TcpListener::bind(args.metrics_listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.metrics_listen))?;
    tracing::info!(listen = %args.metrics_listen, "serving /metrics and /healthz");
    let server = tokio::spawn(http::serve(listener, Arc::new(registry), shutdown.clone()));

    let client = Client::try_default()
        .await
        .map_err(|e| format!("no Kubernetes client configuration: {e}"))?;
    let watch_namespace = args.watch_namespace.clone().filter(|ns| !ns.is_empty());
    controller::check_crd_installed(&client, watch_namespace.as_deref())
        .await
        .map_err(|e| format!("RealtimeRoutes are not readable ({e}); is the CRD installed? `patchbay-operator crd | kubectl apply -f -`"))?;

    let identity = holder_identity();
    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics.clone(),
        args.gateway_image.clone(),
        Some(identity.clone()),
    ));

    let mut lost_leadership = false;
    let mut controller_ended = false;
    if args.leader_election {
        let mut elector =
            LeaderElector::new(client, &args.lease_namespace, &args.lease_name, &identity);
        tracing::info!(lease = %args.lease_name, namespace = %args.lease_namespace, %identity, "waiting for leadership");
        if elector.acquire(&shutdown).await {
            tracing::info!(%identity, "leading");
            metrics.leader.set(1);
            let controller = tokio::spawn(lead(ctx, watch_namespace, shutdown.clone()));
            // Losing the Lease stops reconciling at once rather than finishing in-flight
            // reconciles: it may be another replica's LEASE_DURATION - RENEW_DEADLINE from now.
            let ended = leader::term(elector.hold(), controller, &shutdown).await;
            metrics.leader.set(0);
            match ended {
                leader::Term::Lost => lost_leadership = true,
                leader::Term::Stopped => elector.release().await,
                leader::Term::ControllerEnded => {
                    tracing::error!("the controller stopped by itself; giving the lease up");
                    controller_ended = true;
                    elector.release().await;
                }
            }
            shutdown.cancel();
        }
    } else {
        metrics.leader.set(1);
        lead(ctx, watch_namespace, shutdown.clone()).await;
    }

    shutdown.cancel();
    let _ = server.await;
    if lost_leadership {
        return Err("lost leadership; exiting to campaign again".into());
    }
    if controller_ended {
        return Err("the controller stopped; exiting to campaign again".into());
    }
    tracing::info!("stopped");
    Ok(())
}

/// What the leader runs until `stop`: the controller and the pod deletion-cost keeper.
async fn lead(ctx: Arc<Context>, watch_namespace: Option<String>, stop: CancellationToken) {
    let keeper = tokio::spawn(deletion_cost::run(
        ctx.clone(),
        watch_namespace.clone(),
        stop.clone(),
    ));
    let stopped = stop.clone();
    controller::run(
        ctx,
        watch_namespace,
        async move { stopped.cancelled().await },
    )
    .await;
    stop.cancel();
    let _ = keeper.await;
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!("no SIGTERM handler ({e}); stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received; finishing in-flight reconciles");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> RunArgs {
        let mut argv = vec!["patchbay-operator", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(args) => args,
            other => unreachable!("{other:?}"),
        }
    }

    #[test]
    fn run_defaults_match_the_chart_contract() {
        let args = parse(&[]);
        assert_eq!(args.gateway_image, "patchbay/gateway:0.1.0");
        assert_eq!(args.metrics_listen.to_string(), "0.0.0.0:8080");
        assert_eq!(args.lease_name, "patchbay-operator");
        assert_eq!(args.lease_namespace, "default");
        assert!(args.watch_namespace.is_none());
        assert!(!args.leader_election);
    }

    #[test]
    fn leader_election_accepts_a_bare_flag_or_a_boolean() {
        assert!(parse(&["--leader-election"]).leader_election);
        assert!(parse(&["--leader-election=true"]).leader_election);
        assert!(!parse(&["--leader-election=false"]).leader_election);
    }

    #[test]
    fn render_takes_a_file_a_namespace_and_the_run_default_image() {
        let cli = Cli::try_parse_from(["patchbay-operator", "render", "-f", "route.yaml"]).unwrap();
        let Command::Render(args) = cli.command else {
            panic!("render is a subcommand");
        };
        assert_eq!(args.file, PathBuf::from("route.yaml"));
        assert_eq!(args.namespace, "default");
        assert_eq!(args.gateway_image, parse(&[]).gateway_image);
        assert!(Cli::try_parse_from(["patchbay-operator", "render"]).is_err());
    }

    #[test]
    fn crd_is_a_subcommand() {
        assert!(matches!(
            Cli::try_parse_from(["patchbay-operator", "crd"])
                .unwrap()
                .command,
            Command::Crd
        ));
    }
}
