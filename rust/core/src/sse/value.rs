//! The chunk reader through a `serde_json::Value`: the path that decides
//! every chunk the faster readers (`scan`, `typed`) give up on, and words
//! every error.

use serde_json::Value;

use super::chunk::{
    Choice, Chunk, FoundChoice, FoundDelta, SpecSteps, Usage, SPEC_SUMMARY_KEYS, TIMINGS_KEYS,
};
use super::error::SseError;

fn shape(path: impl Into<String>, expected: &'static str) -> SseError {
    SseError::Shape {
        path: path.into(),
        expected,
    }
}

fn opt_str(v: Option<&Value>, path: impl FnOnce() -> String) -> Result<Option<String>, SseError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(shape(path(), "a string or null")),
    }
}

fn opt_u64(v: Option<&Value>, path: impl FnOnce() -> String) -> Result<Option<u64>, SseError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| shape(path(), "a non-negative integer")),
        Some(_) => Err(shape(path(), "a non-negative integer")),
    }
}

/// An optional array of u32 counts at `path`.
fn opt_u32_list(v: Option<&Value>, path: &str) -> Result<Option<Vec<u32>>, SseError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for (j, x) in a.iter().enumerate() {
                let n = x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| shape(format!("{path}[{j}]"), "an integer in 0..=4294967295"))?;
                out.push(n);
            }
            Ok(Some(out))
        }
        Some(_) => Err(shape(path, "an array of integers or null")),
    }
}

/// `metrics.speculative_decoding`, if the chunk has it.
fn spec_steps(metrics: Option<&Value>) -> Result<Option<SpecSteps>, SseError> {
    let metrics = match metrics {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(shape("metrics", "an object or null")),
    };
    let spec = match metrics.get("speculative_decoding") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(shape("metrics.speculative_decoding", "an object or null")),
    };
    Ok(Some(SpecSteps {
        per_step_accepted: opt_u32_list(
            spec.get("per_step_accepted"),
            "metrics.speculative_decoding.per_step_accepted",
        )?,
        per_step_drafted: opt_u32_list(
            spec.get("per_step_drafted"),
            "metrics.speculative_decoding.per_step_drafted",
        )?,
        summary: counts(spec, &SPEC_SUMMARY_KEYS, "metrics.speculative_decoding")?,
    }))
}

/// The counts named `keys` of the object at `path`, each optional.
fn counts(
    object: &serde_json::Map<String, Value>,
    keys: &[&str; 3],
    path: &str,
) -> Result<[Option<u64>; 3], SseError> {
    let mut out = [None; 3];
    for (slot, key) in out.iter_mut().zip(keys) {
        *slot = opt_u64(object.get(*key), || format!("{path}.{key}"))?;
    }
    Ok(out)
}

/// llama-server's `timings` counters, if the chunk has a `timings` object.
fn timings(value: Option<&Value>) -> Result<Option<[Option<u64>; 3]>, SseError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(t)) => Ok(Some(counts(t, &TIMINGS_KEYS, "timings")?)),
        Some(_) => Err(shape("timings", "an object or null")),
    }
}

/// An error object's `message`, else the whole object as JSON.
fn server_error(error: &Value) -> SseError {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    SseError::Server { message }
}

/// [`parse_chunk`] through a `serde_json::Value`: the path that decides
/// every chunk the typed path gives up on, and every error message.
pub fn parse_chunk_value(data: &str) -> Result<Chunk, SseError> {
    let v: Value = serde_json::from_str(data).map_err(|e| SseError::Json {
        message: e.to_string(),
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| shape("the data", "a JSON object"))?;
    if let Some(err) = obj.get("error") {
        return Err(server_error(err));
    }
    if obj.get("object").and_then(Value::as_str) == Some("error") {
        return Err(server_error(&v));
    }
    let id = opt_str(obj.get("id"), || "id".to_owned())?;
    let choices = match obj.get("choices") {
        None => return Err(shape("choices", "present")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(shape("choices", "an array")),
    };
    let mut out = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        out.push(parse_choice(i, c)?);
    }
    let usage = match obj.get("usage") {
        None | Some(Value::Null) => None,
        Some(Value::Object(u)) => Some(Usage {
            prompt_tokens: opt_u64(u.get("prompt_tokens"), || "usage.prompt_tokens".into())?,
            completion_tokens: opt_u64(u.get("completion_tokens"), || {
                "usage.completion_tokens".into()
            })?,
            total_tokens: opt_u64(u.get("total_tokens"), || "usage.total_tokens".into())?,
        }),
        Some(_) => return Err(shape("usage", "an object or null")),
    };
    let spec_steps = spec_steps(obj.get("metrics"))?;
    let timings = timings(obj.get("timings"))?.map(Box::new);
    Ok(Chunk {
        id,
        choices: out,
        usage,
        spec_steps,
        timings,
    })
}

/// A choice's field with its path below the choice, unless absent or null.
fn found<'v>(v: Option<&'v Value>, path: &'static str) -> Option<(&'v Value, &'static str)> {
    v.filter(|v| !v.is_null()).map(|v| (v, path))
}

fn parse_choice(i: usize, c: &Value) -> Result<Choice, SseError> {
    let c = c
        .as_object()
        .ok_or_else(|| shape(format!("choices[{i}]"), "an object"))?;
    let index = match c.get("index") {
        Some(Value::Number(n)) => {
            n.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    shape(
                        format!("choices[{i}].index"),
                        "an integer in 0..=4294967295",
                    )
                })?
        }
        None => return Err(shape(format!("choices[{i}].index"), "present")),
        Some(_) => {
            return Err(shape(
                format!("choices[{i}].index"),
                "an integer in 0..=4294967295",
            ))
        }
    };
    let delta = match c.get("delta") {
        None | Some(Value::Null) => None,
        Some(Value::Object(d)) => Some(d),
        Some(_) => return Err(shape(format!("choices[{i}].delta"), "an object")),
    };
    // Only the fields the rule picks are read (and can be wrong).
    let (text, token_ids) = FoundChoice {
        delta: delta.map(|d| FoundDelta {
            content: found(d.get("content"), "delta.content"),
            token_ids: found(d.get("token_ids"), "delta.token_ids"),
        }),
        text: found(c.get("text"), "text"),
        token_ids: c.get("token_ids").map(|v| found(Some(v), "token_ids")),
    }
    .resolve();
    let text = match text {
        None => String::new(),
        Some((Value::String(s), _)) => s.clone(),
        Some((_, path)) => return Err(shape(format!("choices[{i}].{path}"), "a string or null")),
    };
    let token_ids = match token_ids {
        None => None,
        Some((Value::Array(a), path)) => {
            let mut ids = Vec::with_capacity(a.len());
            for (j, t) in a.iter().enumerate() {
                let id = t
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        shape(
                            format!("choices[{i}].{path}[{j}]"),
                            "an integer in 0..=4294967295",
                        )
                    })?;
                ids.push(id);
            }
            Some(ids)
        }
        Some((_, path)) => {
            return Err(shape(
                format!("choices[{i}].{path}"),
                "an array of integers or null",
            ))
        }
    };
    let finish_reason = opt_str(c.get("finish_reason"), || {
        format!("choices[{i}].finish_reason")
    })?;
    Ok(Choice {
        index,
        text,
        token_ids,
        finish_reason,
    })
}
