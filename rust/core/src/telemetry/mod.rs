//! The telemetry side of the client: the socket the plugin's datagrams
//! arrive on (`receiver`, Linux) and the HTTP telemetry stream's framing
//! (`stream`).

#[cfg(target_os = "linux")]
pub mod receiver;
#[cfg(not(target_os = "linux"))]
#[path = "receiver_unsupported.rs"]
pub mod receiver;
pub mod stream;
