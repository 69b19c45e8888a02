//! `SpanRecords`: one stream's proven spans for the screen, two u64 words a
//! span (end offset into the stream's SSE text, then `step | role << 32`;
//! `fed::span_word`), as `StreamState.span_records`.
//!
//! Why not `array('Q')`: `Reconciler.take` appends every stream's new spans
//! at each redraw, and an array grows by 1/16 of its size, so the 64 arrays
//! of a run were reallocated and copied over and over (a third of the
//! client's span handling on the benchmark run). Here the vector doubles, and
//! `take` appends in Rust: no `bytes` object and no Python call per stream.
//! No buffer protocol: nothing can hold a view that a later append would
//! invalidate; `tail_pieces` reads the words directly.

use parallelhue_core::fed::{NO_ROLE, SPAN_RECORD_BYTES};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

#[pyclass(module = "parallelhue._native", sequence)]
#[derive(Default)]
pub(crate) struct SpanRecords {
    pub(crate) words: Vec<u64>,
    has_roles: bool,
}

impl SpanRecords {
    /// Append packed records (16 bytes a span, little-endian words).
    pub(crate) fn append_packed(&mut self, data: &[u8]) {
        debug_assert!(data.len().is_multiple_of(SPAN_RECORD_BYTES));
        let before = self.words.len();
        self.words.extend(
            data.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))),
        );
        if !self.has_roles {
            self.has_roles = self.words[before..]
                .iter()
                .skip(1)
                .step_by(2)
                .any(|&w| role_of(w) != u64::from(NO_ROLE));
        }
    }

    fn index(&self, i: isize) -> PyResult<usize> {
        let n = self.words.len() as isize;
        let at = if i < 0 { i + n } else { i };
        if (0..n).contains(&at) {
            Ok(at as usize)
        } else {
            Err(PyIndexError::new_err("span record index out of range"))
        }
    }

    /// Note a role when `word` (at `at`) is a span's step/role word.
    fn saw(&mut self, at: usize, word: u64) {
        if !at.is_multiple_of(2) && role_of(word) != u64::from(NO_ROLE) {
            self.has_roles = true;
        }
    }
}

fn role_of(word: u64) -> u64 {
    (word >> 32) & u64::from(NO_ROLE)
}

#[pymethods]
impl SpanRecords {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    fn __len__(&self) -> usize {
        self.words.len()
    }

    fn __getitem__(&self, i: isize) -> PyResult<u64> {
        Ok(self.words[self.index(i)?])
    }

    fn __setitem__(&mut self, i: isize, word: u64) -> PyResult<()> {
        let at = self.index(i)?;
        self.words[at] = word;
        self.saw(at, word);
        Ok(())
    }

    /// Append words (ints), as `array.extend`.
    fn extend(&mut self, words: Vec<u64>) {
        for word in words {
            self.words.push(word);
            self.saw(self.words.len() - 1, word);
        }
    }

    /// Append spans packed as `Reconciler.take` packs them (16 bytes a span);
    /// ValueError for a length that is not whole spans.
    fn frombytes(&mut self, data: &[u8]) -> PyResult<()> {
        if !data.len().is_multiple_of(SPAN_RECORD_BYTES) {
            return Err(PyValueError::new_err(format!(
                "span records come in {SPAN_RECORD_BYTES}-byte spans; got {} bytes",
                data.len()
            )));
        }
        self.append_packed(data);
        Ok(())
    }

    /// The words as little-endian bytes (16 a span).
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut out = Vec::with_capacity(self.words.len() * 8);
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        PyBytes::new(py, &out)
    }

    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, &self.words)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.tolist(py)?.try_iter().map(Bound::into_any)
    }

    /// Whether a span carried a token role (contract C2).
    #[getter]
    fn has_roles(&self) -> bool {
        self.has_roles
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<SpanRecords>()
            .is_ok_and(|o| o.borrow().words == self.words)
    }

    fn __repr__(&self) -> String {
        format!("SpanRecords({} spans)", self.words.len() / 2)
    }
}
