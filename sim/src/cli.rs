//! The simulator's command line, shared by the `patchbay-sim` binary and
//! `patchbay-gateway sim`: flags, fault parsing, and serving until a signal.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::{LiveSim, SimConfig, SimFault, TranscriptionUsage};

/// Exit code for bad flags.
pub const EXIT_USAGE: u8 = 2;

/// Flags of a simulator run.
#[derive(Debug, Args)]
pub struct SimArgs {
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub listen: SocketAddr,
    /// Accepted upstream keys, comma-separated (empty: any key).
    #[arg(long, value_delimiter = ',')]
    pub keys: Vec<String>,
    #[arg(long, default_value_t = 0)]
    pub upgrade_delay_ms: u64,
    #[arg(long, default_value_t = 0)]
    pub session_delay_ms: u64,
    #[arg(long, default_value_t = 0)]
    pub inference_delay_ms: u64,
    #[arg(long, default_value_t = 5)]
    pub audio_deltas: usize,
    /// Decoded bytes of audio per delta.
    #[arg(long, default_value_t = 2400)]
    pub audio_delta_bytes: usize,
    #[arg(long, default_value_t = 0)]
    pub delta_interval_ms: u64,
    /// `refuse:STATUS`, `error-first`, `key-error-first`, `drop:N` (after N
    /// deltas) or `close:CODE`.
    #[arg(long)]
    pub fault: Option<String>,
    /// Response turns the simulated caller speaks per call (WebRTC or
    /// SIP), on the call's sideband.
    #[arg(long, default_value_t = 0)]
    pub caller_turns: usize,
    /// Time before each of the caller's turns.
    #[arg(long, default_value_t = 200)]
    pub caller_turn_interval_ms: u64,
    /// Timestamp frames for the calls benchmark: audio deltas carry their
    /// send time in `event_id`, `input_audio_buffer.committed` the transit
    /// times of the stamped appends it commits (see the `stamp` module).
    #[arg(long)]
    pub stamp_frames: bool,
    /// The usage of each input-audio transcription: `tokens` (default) or
    /// `duration:SECONDS` (`{"type": "duration", "seconds": SECONDS}`).
    #[arg(long, default_value = "tokens")]
    pub transcription_usage: String,
    /// Time between a Live session's `session.usage.updated` events.
    #[arg(long, default_value_t = 1000)]
    pub live_usage_interval_ms: u64,
    /// Billed seconds a Live session counts per real second (1: real
    /// time; 60: a minute a second, for quick checks).
    #[arg(long, default_value_t = 1.0)]
    pub live_time_scale: f64,
}

impl SimArgs {
    /// The simulator these flags describe, or what is wrong with them.
    pub fn config(&self) -> Result<SimConfig, String> {
        let fault = self.fault.as_deref().map(parse_fault).transpose()?;
        let transcription_usage = parse_transcription_usage(&self.transcription_usage)?;
        if !(self.live_time_scale.is_finite() && self.live_time_scale > 0.0) {
            return Err(format!(
                "--live-time-scale needs a number > 0, got {}",
                self.live_time_scale
            ));
        }
        if self.live_usage_interval_ms == 0 {
            return Err("--live-usage-interval-ms needs a number > 0".into());
        }
        Ok(SimConfig {
            live: LiveSim {
                usage_interval: Duration::from_millis(self.live_usage_interval_ms),
                time_scale: self.live_time_scale,
                fault: None,
            },
            transcription_usage,
            keys: self.keys.clone(),
            upgrade_delay: Duration::from_millis(self.upgrade_delay_ms),
            session_delay: Duration::from_millis(self.session_delay_ms),
            inference_delay: Duration::from_millis(self.inference_delay_ms),
            audio_deltas: self.audio_deltas,
            audio_delta_bytes: self.audio_delta_bytes,
            delta_interval: Duration::from_millis(self.delta_interval_ms),
            fault,
            caller_turns: self.caller_turns,
            caller_turn_interval: Duration::from_millis(self.caller_turn_interval_ms),
            stamp_frames: self.stamp_frames,
            ..SimConfig::default()
        })
    }
}

/// `refuse:STATUS`, `error-first`, `key-error-first`, `drop:N`, `close:CODE`, `usage-max`,
/// `done-twice`.
pub fn parse_fault(s: &str) -> Result<SimFault, String> {
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
        "usage-max" => Ok(SimFault::UsageMax),
        "done-twice" => Ok(SimFault::DoneTwice),
        _ => Err(format!(
            "unknown --fault {s:?}: use refuse:STATUS, error-first, key-error-first, drop:N, close:CODE, usage-max or done-twice"
        )),
    }
}

/// `tokens` or `duration:SECONDS` (a finite number >= 0).
pub fn parse_transcription_usage(s: &str) -> Result<TranscriptionUsage, String> {
    match s.split_once(':') {
        None if s == "tokens" => Ok(TranscriptionUsage::Tokens),
        Some(("duration", n)) => match n.parse::<f64>() {
            Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => {
                Ok(TranscriptionUsage::Duration { seconds })
            }
            _ => Err(format!(
                "--transcription-usage duration:SECONDS needs a number >= 0, got {n:?}"
            )),
        },
        _ => Err(format!(
            "unknown --transcription-usage {s:?}: use tokens or duration:SECONDS"
        )),
    }
}

/// Serves `args` until SIGTERM or SIGINT (`name` prefixes error lines).
pub fn run(name: &str, args: &SimArgs) -> ExitCode {
    let config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        match crate::start(args.listen, config).await {
            Ok(handle) => {
                println!("simulator listening on {}", handle.url(false));
                stopped().await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{name}: cannot listen on {}: {e}", args.listen);
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGTERM or SIGINT (or a failure to listen for them: then at once).
async fn stopped() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_bad_ones_are_named() {
        assert!(matches!(
            parse_fault("refuse:503"),
            Ok(SimFault::Refuse { status: 503 })
        ));
        assert!(matches!(
            parse_fault("drop:3"),
            Ok(SimFault::DropMidResponse { after_deltas: 3 })
        ));
        assert!(matches!(parse_fault("usage-max"), Ok(SimFault::UsageMax)));
        assert!(matches!(parse_fault("done-twice"), Ok(SimFault::DoneTwice)));
        assert!(parse_fault("drop:x")
            .unwrap_err()
            .contains("needs a number"));
        assert!(parse_fault("melt").unwrap_err().contains("unknown --fault"));
    }

    #[test]
    fn transcription_usage_shapes_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_transcription_usage("tokens"),
            Ok(TranscriptionUsage::Tokens)
        );
        assert_eq!(
            parse_transcription_usage("duration:2.5"),
            Ok(TranscriptionUsage::Duration { seconds: 2.5 })
        );
        assert_eq!(
            TranscriptionUsage::Duration { seconds: 2.5 }.json(),
            serde_json::json!({"type": "duration", "seconds": 2.5})
        );
        assert!(parse_transcription_usage("duration:-1").is_err());
        assert!(parse_transcription_usage("minutes").is_err());
    }
}
