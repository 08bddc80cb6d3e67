//! `tcp-relay LISTEN UPSTREAM`: see [`patchbay_bench::tcp_relay`].

use std::process::ExitCode;

fn main() -> ExitCode {
    patchbay_bench::relay_main::run(
        "tcp-relay",
        "tcp-relay LISTEN_ADDR UPSTREAM_ADDR",
        patchbay_bench::tcp_relay::serve,
    )
}
