//! Close codes the teardown sends (RFC 6455 §7.4.1).

pub const NORMAL: u16 = 1000;
pub const GOING_AWAY: u16 = 1001;
pub const PROTOCOL_ERROR: u16 = 1002;
pub const INVALID_PAYLOAD: u16 = 1007;
pub const POLICY: u16 = 1008;
pub const TOO_BIG: u16 = 1009;
pub const INTERNAL: u16 = 1011;
pub const TRY_AGAIN_LATER: u16 = 1013;
