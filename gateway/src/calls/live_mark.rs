//! A WebRTC Live session's charged mark in the fleet's records
//! (`live_charged`, [`super::fleet`]): the figure each window brings the
//! session to, raised in Redis before the window is charged
//! ([`crate::metering::live::ChargedMark`]), so a replica killed between
//! the two leaves the mark ahead of its charges and the replica adopting
//! the session from the mark charges nothing twice.
//! The ids of the delegated responses charged are kept the same way
//! (`live_delegated`), added before they are charged.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::metering::live::ChargedMark;

use super::fleet::CallFleet;

/// One session's mark.
#[derive(Debug)]
pub struct FleetMark {
    pub fleet: CallFleet,
    pub call_id: String,
    /// How long the mark outlives its last raise.
    pub ttl: Duration,
}

impl ChargedMark for FleetMark {
    fn mark(&self, charged_ms: u64) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(
            self.fleet
                .mark_live_charged(&self.call_id, charged_ms, self.ttl),
        )
    }

    fn mark_delegated(
        &self,
        response_ids: Vec<String>,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async move {
            self.fleet
                .mark_live_delegated(&self.call_id, &response_ids, self.ttl)
                .await
        })
    }
}
