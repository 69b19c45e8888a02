//! Conversions between Python objects and Rust values shared by the bindings.

use parallelhue_core::reconcile::ArgError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList};

pub(crate) fn value_error(e: impl ToString) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Python's `str()` of an object, for messages.
pub(crate) fn repr_str(obj: &Bound<'_, PyAny>) -> String {
    obj.str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The datagram as `bytes`: `bytes` itself, or `bytes(obj)` for any other
/// bytes-like object (as the reference reconciler does).
pub(crate) fn frame_bytes<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.clone());
    }
    let py = obj.py();
    Ok(py
        .get_type::<PyBytes>()
        .call1((obj,))?
        .cast_into::<PyBytes>()?)
}

pub(crate) fn token_ids(list: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let mut out = Vec::new();
    token_ids_into(list, &mut out)?;
    Ok(out)
}

fn token_id(item: &Bound<'_, PyAny>) -> PyResult<u32> {
    match item.extract::<u32>() {
        Ok(v) => Ok(v),
        Err(_) => {
            // Only ints get the range message; other types a TypeError.
            item.cast::<PyInt>()?;
            Err(value_error(ArgError::TokenId(repr_str(item))))
        }
    }
}

/// Append the token ids of `list` (any iterable of ints; a list is read directly).
pub(crate) fn token_ids_into(list: &Bound<'_, PyAny>, out: &mut Vec<u32>) -> PyResult<()> {
    if let Ok(l) = list.cast::<PyList>() {
        out.reserve(l.len());
        for item in l.iter() {
            out.push(token_id(&item)?);
        }
        return Ok(());
    }
    for item in list.try_iter()? {
        out.push(token_id(&item?)?);
    }
    Ok(())
}

/// `completion_tokens`: None or an int in 0..=u64::MAX.
pub(crate) fn completion_tokens(value: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
    if value.is_none() {
        return Ok(None);
    }
    match value.extract::<u64>() {
        Ok(v) => Ok(Some(v)),
        Err(_) => {
            value.cast::<PyInt>()?;
            Err(value_error(ArgError::CompletionTokens(repr_str(value))))
        }
    }
}

/// A per-step count list: None or an iterable of ints in 0..=u32::MAX.
pub(crate) fn step_counts(value: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u32>>> {
    if value.is_none() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for item in value.try_iter()? {
        let item = item?;
        match item.extract::<u32>() {
            Ok(v) => out.push(v),
            Err(_) => {
                item.cast::<PyInt>()?;
                return Err(value_error(ArgError::StepCount(repr_str(&item))));
            }
        }
    }
    Ok(Some(out))
}
