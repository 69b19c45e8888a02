//! `HttpBody`: the HTTP/1.1 response body decoder.

use parallelhue_core::http::{BodyDecoder, Framing};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::convert::value_error;

pub(crate) fn parse_framing(framing: &str, length: Option<u64>) -> PyResult<Framing> {
    match (framing, length) {
        ("chunked", None) => Ok(Framing::Chunked),
        ("length", Some(n)) => Ok(Framing::Length(n)),
        ("close", None) => Ok(Framing::Close),
        _ => Err(value_error(format!(
            "framing must be 'chunked', 'close' or 'length' with a length, got {framing:?} with {length:?}"
        ))),
    }
}

/// An HTTP/1.1 response body decoder: chunked, Content-Length or
/// close-delimited (rust/core/src/http.rs).
#[pyclass(module = "parallelhue._native")]
pub(crate) struct HttpBody {
    inner: BodyDecoder,
}

#[pymethods]
impl HttpBody {
    #[new]
    #[pyo3(signature = (framing, length = None))]
    fn new(framing: &str, length: Option<u64>) -> PyResult<Self> {
        Ok(HttpBody {
            inner: BodyDecoder::new(parse_framing(framing, length)?),
        })
    }

    /// Bytes from the connection; returns the body bytes they hold. Raises
    /// ValueError when the framing is broken.
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::with_capacity(data.len());
        self.inner.feed(data, &mut out).map_err(value_error)?;
        Ok(PyBytes::new(py, &out))
    }

    /// The connection closed; raises ValueError if the body was cut short.
    fn close(&mut self) -> PyResult<()> {
        self.inner.finish().map_err(value_error)
    }

    /// The whole body was read.
    #[getter]
    fn complete(&self) -> bool {
        self.inner.is_complete()
    }
}
