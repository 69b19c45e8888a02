//! What each sending source announced (its hello) and its sequence state.

use std::collections::{BTreeMap, HashMap};

use crate::protocol::{Hello, HelloFields};
use crate::sequence::SeqTracker;

use super::ROLE_SCHEDULER;

/// What a hello announced, and which source sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceInfo {
    pub source_id: u64,
    pub hello: HelloFields,
}

impl SourceInfo {
    pub(super) fn from_hello(source_id: u64, h: &Hello<'_>) -> Self {
        SourceInfo {
            source_id,
            hello: HelloFields::from(h),
        }
    }

    pub fn role_name(&self) -> &'static str {
        role_name(self.hello.role)
    }

    pub fn engine_name(&self) -> &'static str {
        engine_name(self.hello.engine)
    }

    pub fn role_derivation_name(&self) -> &'static str {
        match self.hello.role_derivation {
            0 => "none",
            1 => "draft_ids",
            _ => "counts",
        }
    }

    pub fn verification_name(&self) -> &'static str {
        match self.hello.verification {
            0 => "none",
            1 => "standard",
            2 => "synthetic",
            3 => "fly",
            _ => "unknown",
        }
    }
}

pub(super) fn role_name(role: u8) -> &'static str {
    if role == ROLE_SCHEDULER {
        "scheduler"
    } else {
        "frontend"
    }
}

pub(super) fn engine_name(engine: u8) -> &'static str {
    if engine == 1 {
        "vllm"
    } else {
        "simulated"
    }
}

pub(super) struct Source {
    pub(super) seq: SeqTracker<Vec<u8>>,
    /// Keyed digest of every frame received, by sequence number: a
    /// duplicate must be byte-identical.
    pub(super) digests: BTreeMap<u64, crate::digest::Digest>,
    /// Role from its hello, once released.
    pub(super) role: Option<u8>,
    /// Index of its hello in `infos`.
    pub(super) info: usize,
    /// Its first released frame was not a hello: the rest is ignored.
    pub(super) broken: bool,
}

pub(super) fn source_info(sources: &HashMap<u64, Source>, src: u64) -> usize {
    sources.get(&src).map_or(0, |s| s.info)
}
