//! `patchbay-bench`: see the crate docs and `benchmarks/README.md`.

use std::process::ExitCode;

use clap::Parser;
use patchbay_bench::args::Cli;

/// Exit code for a bad command line or unusable targets.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.validate() {
        eprintln!("patchbay-bench: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    // One thread by default: at the concurrency this bench targets, a
    // current-thread runtime costs less CPU than a work-stealing one and
    // leaves the cores to what is being measured (see the README).
    let runtime = if cli.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cli.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("patchbay-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if cli.calls.is_some() {
        return calls(&cli, &runtime);
    }
    let outcome = match runtime.block_on(patchbay_bench::execute(&cli, true)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("patchbay-bench: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let report = outcome.report();
    print!("{}", report.render());
    if let Some(path) = &cli.out {
        if let Err(e) = std::fs::write(path, report.to_json()) {
            eprintln!("patchbay-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("\nsamples written to {}", path.display());
    }
    ExitCode::SUCCESS
}

/// The calls mode: runs, prints and writes the calls report.
fn calls(cli: &Cli, runtime: &tokio::runtime::Runtime) -> ExitCode {
    let result = match runtime.block_on(patchbay_bench::calls_run::execute(cli, true)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("patchbay-bench: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    print!("{}", result.render());
    if let Some(path) = &cli.out {
        if let Err(e) = std::fs::write(path, result.to_json()) {
            eprintln!("patchbay-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("\nfigures written to {}", path.display());
    }
    ExitCode::SUCCESS
}
