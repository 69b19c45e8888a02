//! The telemetry socket needs Linux (`SO_PASSCRED` / `SCM_CREDENTIALS` to
//! check each sender's uid). Elsewhere `Receiver::bind` fails with a clear
//! error (the reference path, `--reconciler python`, reads the socket in Python).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::fed::Fed;

/// A point-in-time copy of the counters (same fields as on Linux).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    pub received: u64,
    pub bytes: u64,
    pub rejected_uid: u64,
    pub last_rejected_uid: Option<u32>,
    pub accepted_foreign: u64,
    pub oversized: u64,
    pub batches: u64,
    pub errors: u64,
    pub rcvbuf: u64,
}

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
