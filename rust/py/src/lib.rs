use pyo3::prelude::*;

/// The native half of ParallelHue (see docs/PROTOCOL.md).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PROTOCOL_VERSION", 1u8)?;
    Ok(())
}
