//! `SpanRecords`: the Python face of one stream's span records
//! (`parallelhue_core::spans::SpanRecords`, two u64 words a span), as
//! `StreamState.span_records`. `Reconciler.take` appends to it in Rust (no
//! `bytes` object and no Python call per stream), `tail_pieces` reads it in
//! place; no buffer protocol, so nothing can hold a view that a later append
//! would invalidate. Here only conversions; the logic is the core's.

use parallelhue_core::spans;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

#[pyclass(module = "parallelhue._native", sequence)]
#[derive(Default)]
pub(crate) struct SpanRecords {
    pub(crate) records: spans::SpanRecords,
}

impl SpanRecords {
    fn position(&self, i: isize) -> PyResult<usize> {
        self.records
            .position(i)
            .ok_or_else(|| PyIndexError::new_err("span record index out of range"))
    }
}

#[pymethods]
impl SpanRecords {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    fn __len__(&self) -> usize {
        self.records.words().len()
    }

    fn __getitem__(&self, i: isize) -> PyResult<u64> {
        Ok(self.records.words()[self.position(i)?])
    }

    fn __setitem__(&mut self, i: isize, word: u64) -> PyResult<()> {
        let at = self.position(i)?;
        self.records.set(at, word);
        Ok(())
    }

    /// Append words (ints), as `array.extend`.
    fn extend(&mut self, words: Vec<u64>) {
        self.records.extend(words);
    }

    /// Append spans packed as `Reconciler.take` packs them (16 bytes a span);
    /// ValueError for a length that is not whole spans.
    fn frombytes(&mut self, data: &[u8]) -> PyResult<()> {
        self.records
            .append_bytes(data)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The words as little-endian bytes (16 a span).
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.records.to_le_bytes())
    }

    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.records.words())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.tolist(py)?.try_iter().map(Bound::into_any)
    }

    /// Whether a span carried a token role (contract C2).
    #[getter]
    fn has_roles(&self) -> bool {
        self.records.has_roles()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<SpanRecords>()
            .is_ok_and(|o| o.borrow().records.words() == self.records.words())
    }

    fn __repr__(&self) -> String {
        format!("SpanRecords({} spans)", self.records.words().len() / 2)
    }
}
