//! The live screen's hot loop: the styled tail of one stream's proven spans
//! (`parallelhue.model.state.StreamState.tail_segments`), one call per pane redraw.
//!
//! In Python each span cost a slice, a `decode` and a tuple (≈ 20 % of the
//! client's main thread at 64 streams in the grid). Here the buffers are read
//! in place and the core reads the tail (`parallelhue_core::spans::tail`)
//! with no Python object made (so nothing can touch the buffers meanwhile),
//! then the pieces are built in one go.

use parallelhue_core::spans::{tail, PieceKey, TailKeys};
use pyo3::buffer::{PyBuffer, PyUntypedBuffer};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::spans::SpanRecords;

/// The last spans of `records` (two u64 words a span: end offset into `data`,
/// step | role << 32) holding at least `limit - total` characters (all for
/// limit < 0), as a list of (text, key) in text order. Keys: None without
/// `keys`; by role `keys[role byte]` (256 keys); by step `keys[step %
/// len(keys)]`, `other` for a span of several steps.
// The Python signature is the call's shape: one flat call per pane.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (data, records, limit, total, keys, by_role, other))]
pub(crate) fn tail_pieces<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    records: &Bound<'py, PyAny>,
    limit: i64,
    total: i64,
    keys: Option<&Bound<'py, PyTuple>>,
    by_role: bool,
    other: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let data_buf = PyBuffer::<u8>::get(data)?;
    // The live screen's records: read in place (no buffer to export).
    let store = records.cast::<SpanRecords>().ok().map(|r| r.borrow());
    let records_buf = match &store {
        Some(_) => None,
        None => {
            let buf = PyUntypedBuffer::get(records)?;
            // An empty array's buffer may not be aligned: no spans, nothing to check.
            if buf.len_bytes() == 0 {
                None
            } else {
                Some(buf.into_typed::<u64>()?)
            }
        }
    };
    if !data_buf.is_c_contiguous() || records_buf.as_ref().is_some_and(|b| !b.is_c_contiguous()) {
        return Err(PyBufferError::new_err(
            "tail_pieces needs contiguous buffers",
        ));
    }
    let tail_keys = TailKeys::new(keys.map(|k| k.len()), by_role).map_err(PyValueError::new_err)?;
    // No Python object made while the buffers are read.
    let found = {
        // SAFETY: both buffers are exported (neither object can resize) and
        // contiguous, and this block runs no Python code that could write them.
        let bytes = unsafe {
            std::slice::from_raw_parts(data_buf.buf_ptr() as *const u8, data_buf.item_count())
        };
        let words: &[u64] = match (&store, &records_buf) {
            (Some(store), _) => store.records.words(),
            // SAFETY: as above; `into_typed` checked the u64 format and alignment.
            (None, Some(buf)) => unsafe {
                std::slice::from_raw_parts(buf.buf_ptr() as *const u64, buf.item_count())
            },
            (None, None) => &[],
        };
        tail(bytes, words, limit, total, tail_keys)
    };
    let found = found.map_err(|e| PyValueError::new_err(e.to_string()))?;
    let none = py.None().into_bound(py);
    let mut out = Vec::with_capacity(found.pieces.len());
    for (text, key) in found.in_order() {
        let key = match (key, keys) {
            (PieceKey::Index(k), Some(keys)) => keys.get_item(k)?,
            (PieceKey::Other, _) => other.clone(),
            _ => none.clone(),
        };
        out.push(PyTuple::new(py, [PyString::new(py, text).into_any(), key])?);
    }
    PyList::new(py, out)
}
