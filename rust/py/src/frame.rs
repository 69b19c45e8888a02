//! `decode_frame`: one datagram as the vectors' decoded-meaning dict.

use parallelhue_core::describe::frame_meaning;
use parallelhue_core::protocol;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::convert::{json_to_py, value_error};

/// Decode one datagram into the vectors' decoded-meaning dict; raises
#[pyfunction]
pub(crate) fn decode_frame<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let data: &[u8] = if let Ok(b) = frame.cast::<PyBytes>() {
        b.as_bytes()
    } else if let Ok(b) = frame.cast::<PyByteArray>() {
        // Copy: a bytearray may change under us.
        let owned = b.to_vec();
        return match protocol::decode(&owned) {
            Ok(f) => json_to_py(py, &frame_meaning(&f)),
            Err(e) => Err(value_error(e)),
        };
    } else {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "decode_frame expects bytes",
        ));
    };
    match protocol::decode(data) {
        Ok(f) => json_to_py(py, &frame_meaning(&f)),
        Err(e) => Err(value_error(e)),
    }
}
