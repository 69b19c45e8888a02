//! The telemetry side of the client: the socket the plugin's datagrams
//! arrive on (`receiver`, Linux) and in-band telemetry's events (`inband`;
//! the SSE reader reads them with each stream: [`crate::http`]).

pub mod inband;
#[cfg(target_os = "linux")]
pub mod receiver;
#[cfg(not(target_os = "linux"))]
#[path = "receiver_unsupported.rs"]
pub mod receiver;

/// A point-in-time copy of the socket receiver's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    pub received: u64,
    pub bytes: u64,
    pub rejected_uid: u64,
    /// The uid of the last datagram rejected for its uid (None: none, or no credentials).
    pub last_rejected_uid: Option<u32>,
    pub accepted_foreign: u64,
    pub oversized: u64,
    pub batches: u64,
    pub errors: u64,
    /// The socket's receive buffer as the kernel reports it.
    pub rcvbuf: u64,
}
