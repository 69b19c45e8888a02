//! The hello frame (kind 1): what a sending source announces.

use super::reader::Reader;
use super::{DecodeError, VERIFICATION_NONE, VERIFICATION_UNKNOWN};

/// `hello` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    /// 1 scheduler, 2 frontend.
    pub role: u8,
    /// 1 vLLM, 2 simulated.
    pub engine: u8,
    /// 0 none, 1 draft ids, 2 counts only.
    pub role_derivation: u8,
    pub async_scheduling: bool,
    pub num_speculative_tokens: u16,
    /// 0 none, 1 standard, 2 synthetic, 3 fly, 4 unknown.
    pub verification: u16,
    pub plugin_version: &'a str,
    pub engine_version: &'a str,
    pub spec_method: &'a str,
}

pub(super) fn decode_hello<'a>(r: &mut Reader<'a>) -> Result<Hello<'a>, DecodeError> {
    let role = r.u8()?;
    if !(1..=2).contains(&role) {
        return Err(DecodeError::HelloUnknownRole { role });
    }
    let engine = r.u8()?;
    if !(1..=2).contains(&engine) {
        return Err(DecodeError::HelloUnknownEngine { engine });
    }
    let role_derivation = r.u8()?;
    if role_derivation > 2 {
        return Err(DecodeError::HelloUnknownDerivation {
            derivation: role_derivation,
        });
    }
    let async_byte = r.u8()?;
    if async_byte > 1 {
        return Err(DecodeError::HelloAsyncScheduling { value: async_byte });
    }
    let k = r.u16()?;
    let verification = r.u16()?;
    if verification > VERIFICATION_UNKNOWN {
        return Err(DecodeError::HelloUnknownVerification { verification });
    }
    let plugin_version = str8(r, "plugin_version")?;
    let engine_version = str8(r, "engine_version")?;
    let spec_method = str8(r, "spec_method")?;
    let none_d = role_derivation == 0;
    if none_d != spec_method.is_empty()
        || none_d != (k == 0)
        || none_d != (verification == VERIFICATION_NONE)
    {
        return Err(DecodeError::HelloInconsistent {
            method: spec_method.to_owned(),
            k,
            derivation: role_derivation,
            verification,
        });
    }
    // Draft ids are only seen without async scheduling; under it only counts.
    if (role_derivation == 1 && async_byte == 1) || (role_derivation == 2 && async_byte == 0) {
        return Err(DecodeError::HelloDerivationAsync {
            derivation: role_derivation,
            async_scheduling: async_byte,
        });
    }
    // The frontend does not schedule: it has no speculative fields to announce.
    if role == 2 && (role_derivation != 0 || async_byte != 0) {
        return Err(DecodeError::HelloFrontendSpec {
            method: spec_method.to_owned(),
            k,
            derivation: role_derivation,
            async_scheduling: async_byte,
            verification,
        });
    }
    Ok(Hello {
        role,
        engine,
        role_derivation,
        async_scheduling: async_byte == 1,
        num_speculative_tokens: k,
        verification,
        plugin_version,
        engine_version,
        spec_method,
    })
}

fn str8<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<&'a str, DecodeError> {
    let n = r.u8()? as usize;
    let b = r.take(n)?;
    std::str::from_utf8(b).map_err(|_| DecodeError::HelloInvalidUtf8 { field })
}

/// A hello's fields, owned: what a sender encodes and what a reconciler keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloFields {
    pub role: u8,
    pub engine: u8,
    pub role_derivation: u8,
    pub async_scheduling: bool,
    pub num_speculative_tokens: u16,
    pub verification: u16,
    pub plugin_version: String,
    pub engine_version: String,
    pub spec_method: String,
}

impl From<&Hello<'_>> for HelloFields {
    fn from(h: &Hello<'_>) -> Self {
        HelloFields {
            role: h.role,
            engine: h.engine,
            role_derivation: h.role_derivation,
            async_scheduling: h.async_scheduling,
            num_speculative_tokens: h.num_speculative_tokens,
            verification: h.verification,
            plugin_version: h.plugin_version.to_owned(),
            engine_version: h.engine_version.to_owned(),
            spec_method: h.spec_method.to_owned(),
        }
    }
}

impl HelloFields {
    /// A simulated engine's hello for `role` with K speculative tokens (0:
    /// none). A frontend announces no speculative fields whatever K is.
    pub fn simulated(role: u8, k: u16) -> Self {
        let k = if role == 1 { k } else { 0 };
        HelloFields {
            role,
            engine: 2,
            role_derivation: if k == 0 { 0 } else { 1 },
            async_scheduling: false,
            num_speculative_tokens: k,
            verification: if k == 0 { 0 } else { 1 },
            plugin_version: "0.3.0".into(),
            engine_version: "sim-1".into(),
            spec_method: if k == 0 {
                String::new()
            } else {
                "ngram".into()
            },
        }
    }
}
