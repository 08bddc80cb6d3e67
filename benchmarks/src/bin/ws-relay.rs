//! `ws-relay LISTEN UPSTREAM`: see [`patchbay_bench::ws_relay`]. The keys
//! come from the environment (`WS_RELAY_CLIENT_KEY`, `WS_RELAY_UPSTREAM_KEY`)
//! so that they stay out of `ps`; `WS_RELAY_METER=1` makes it the metering
//! floor ([`patchbay_bench::metered`]), its rows on stdout.

use std::process::ExitCode;

use patchbay_bench::metered::Rows;
use patchbay_bench::relay_main;
use patchbay_bench::ws_relay::{self, WsRelay};

const NAME: &str = "ws-relay";
const USAGE: &str =
    "WS_RELAY_CLIENT_KEY=… WS_RELAY_UPSTREAM_KEY=… ws-relay LISTEN_ADDR UPSTREAM_ADDR";

fn main() -> ExitCode {
    let key = |name: &str| std::env::var(name).ok().filter(|k| !k.is_empty());
    let (Some(client_key), Some(upstream_key)) =
        (key("WS_RELAY_CLIENT_KEY"), key("WS_RELAY_UPSTREAM_KEY"))
    else {
        return relay_main::fail(
            NAME,
            USAGE,
            "set WS_RELAY_CLIENT_KEY and WS_RELAY_UPSTREAM_KEY",
        );
    };
    relay_main::run(NAME, USAGE, |listener, upstream| {
        ws_relay::serve(
            listener,
            WsRelay {
                upstream,
                client_key,
                upstream_key,
                meter: std::env::var("WS_RELAY_METER")
                    .is_ok_and(|v| v == "1")
                    .then_some(Rows::Stdout),
            },
        )
    })
}
