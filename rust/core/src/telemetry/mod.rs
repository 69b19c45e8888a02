//! The telemetry side of the client: the socket the plugin's datagrams
//! arrive on (`receiver`, Linux), the HTTP telemetry stream's framing
//! (`stream`) and its way into the run once the HTTP thread has read it
//! (`link`).

#[cfg(unix)]
pub mod link;
#[cfg(target_os = "linux")]
pub mod receiver;
#[cfg(not(target_os = "linux"))]
#[path = "receiver_unsupported.rs"]
pub mod receiver;
pub mod stream;
