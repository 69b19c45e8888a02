//! The live screen's hot loop: the styled tail of one stream's proven spans
//! (`parallelhue.state.StreamState.tail_segments`), one call per pane redraw.
//!
//! In Python each span cost a slice, a `decode` and a tuple (≈ 20 % of the
//! client's main thread at 64 streams in the grid). Here the spans are read and
//! decoded first with no Python object made (so nothing can touch the buffers
//! meanwhile), then the pieces are built in one go.

use std::borrow::Cow;

use pyo3::buffer::{PyBuffer, PyUntypedBuffer};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::spans::SpanRecords;

/// A span's step word when its tokens came from several steps.
const NO_STEP: u64 = 0xFFFF_FFFF;
/// The role byte of a span without a proven role.
const NO_ROLE: u64 = 0xFF;

/// Which key a piece takes.
#[derive(Clone, Copy)]
enum Key {
    None,
    Index(usize),
    Other,
}

/// Characters as Python's `len` counts them after `decode("utf-8", "replace")`.
fn decoded(bytes: &[u8]) -> (Cow<'_, str>, usize) {
    match std::str::from_utf8(bytes) {
        // Code points are the bytes that do not continue a character.
        Ok(text) => (
            Cow::Borrowed(text),
            bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count(),
        ),
        // Both replace each maximal invalid subpart by one U+FFFD (Unicode §3.9).
        Err(_) => {
            let text = String::from_utf8_lossy(bytes);
            let chars = text.chars().count();
            (text, chars)
        }
    }
}

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
        return Err(pyo3::exceptions::PyBufferError::new_err(
            "tail_pieces needs contiguous buffers",
        ));
    }
    let n_keys = keys.map_or(0, |k| k.len());
    if keys.is_some() && (n_keys == 0 || (by_role && n_keys <= NO_ROLE as usize)) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "tail_pieces: by role needs 256 keys, by step at least one",
        ));
    }
    // Phase 1, no Python object made: the spans' texts into one string.
    let mut text = String::new();
    let mut pieces: Vec<(usize, Key)> = Vec::new(); // (end in `text`, key), last span first
    {
        // SAFETY: both buffers are exported (neither object can resize) and
        // contiguous, and this block runs no Python code that could write them.
        let bytes = unsafe {
            std::slice::from_raw_parts(data_buf.buf_ptr() as *const u8, data_buf.item_count())
        };
        let words: &[u64] = match (&store, &records_buf) {
            (Some(store), _) => &store.words,
            // SAFETY: as above; `into_typed` checked the u64 format and alignment.
            (None, Some(buf)) => unsafe {
                std::slice::from_raw_parts(buf.buf_ptr() as *const u64, buf.item_count())
            },
            (None, None) => &[],
        };
        let mut total = total;
        let mut position = words.len() / 2;
        let mut end = if position > 0 {
            words[2 * position - 2]
        } else {
            0
        };
        while position > 0 && (limit < 0 || total < limit) {
            position -= 1;
            let start = if position > 0 {
                words[2 * position - 2]
            } else {
                0
            };
            let word = words[2 * position + 1];
            let span = bytes
                .get(start as usize..end as usize)
                .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("span outside the text"))?;
            let (piece, chars) = decoded(span);
            text.push_str(&piece);
            total += chars as i64;
            let key = if keys.is_none() {
                Key::None
            } else if by_role {
                Key::Index(((word >> 32) & NO_ROLE) as usize)
            } else if word & NO_STEP == NO_STEP {
                Key::Other
            } else {
                Key::Index(((word & NO_STEP) % n_keys as u64) as usize)
            };
            pieces.push((text.len(), key));
            end = start;
        }
    }
    // Phase 2: the pieces, in text order.
    let none = py.None().into_bound(py);
    let mut out = Vec::with_capacity(pieces.len());
    for (i, &(to, key)) in pieces.iter().enumerate().rev() {
        let start = if i > 0 { pieces[i - 1].0 } else { 0 };
        let key = match (key, keys) {
            (Key::Index(k), Some(keys)) => keys.get_item(k)?,
            (Key::Other, _) => other.clone(),
            _ => none.clone(),
        };
        let piece = PyString::new(py, &text[start..to]).into_any();
        out.push(PyTuple::new(py, [piece, key])?);
    }
    PyList::new(py, out)
}
