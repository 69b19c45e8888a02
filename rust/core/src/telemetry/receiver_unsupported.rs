//! The telemetry socket needs Linux (`SO_PASSCRED` / `SCM_CREDENTIALS` to
//! check each sender's uid). Elsewhere `Receiver::bind` fails with a clear
//! error (the reference path, `--reconciler python`, reads the socket in Python).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::fed::Fed;

pub use super::ReceiverStats;

/// Never constructed on this platform.
pub struct Receiver {
    path: PathBuf,
}

impl Receiver {
    pub fn bind(
        _path: &Path,
        _rcvbuf: usize,
        _sink: Arc<Mutex<Fed>>,
        _accept_uids: &[u32],
    ) -> io::Result<Receiver> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the native receiver needs Linux (SO_PASSCRED / SCM_CREDENTIALS)",
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_closed(&self) -> bool {
        true
    }

    pub fn pending(&self) -> bool {
        false
    }

    pub fn stats(&self) -> ReceiverStats {
        ReceiverStats::default()
    }

    pub fn close(&mut self) -> io::Result<()> {
        Ok(())
    }
}
