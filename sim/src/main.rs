//! `patchbay-sim`: the simulated OpenAI upstream on its own (the same as
//! `patchbay-gateway sim`).

use std::process::ExitCode;

use clap::Parser;
use patchbay_sim::cli::{self, SimArgs};

#[derive(Parser)]
#[command(
    name = "patchbay-sim",
    version,
    about = "Simulated OpenAI Realtime upstream"
)]
struct Cli {
    #[command(flatten)]
    args: SimArgs,
}

fn main() -> ExitCode {
    cli::run("patchbay-sim", &Cli::parse().args)
}
