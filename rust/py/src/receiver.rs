//! `Receiver`: the telemetry socket's reading thread.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::reconciler::Reconciler;

/// The telemetry socket: binds `path` (AF_UNIX datagram, mode 0600, or 0622
/// when another uid than root is accepted; SO_PASSCRED) and pushes every
/// datagram from this uid or from `accept_uids` into `reconciler` from a Rust
/// thread that never takes the GIL.
#[pyclass(module = "parallelhue._native", frozen)]
pub(crate) struct Receiver {
    inner: Mutex<parallelhue_core::telemetry::receiver::Receiver>,
    path: PathBuf,
}

#[pymethods]
impl Receiver {
    #[new]
    #[pyo3(signature = (path, reconciler, rcvbuf = 8 << 20, accept_uids = Vec::new()))]
    fn new(
        path: PathBuf,
        reconciler: &Bound<'_, Reconciler>,
        rcvbuf: usize,
        accept_uids: Vec<u32>,
    ) -> PyResult<Self> {
        let sink = Arc::clone(&reconciler.get().inner);
        let rx = parallelhue_core::telemetry::receiver::Receiver::bind(
            &path,
            rcvbuf,
            sink,
            &accept_uids,
        )?;
        Ok(Receiver {
            inner: Mutex::new(rx),
            path,
        })
    }

    /// The socket path.
    #[getter]
    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// Stop the thread (after it pushed what was already queued), close the
    /// socket and unlink its path. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| match self.inner.lock() {
            Ok(mut rx) => rx.close(),
            Err(_) => Ok(()),
        })?;
        Ok(())
    }

    /// Whether datagrams that arrived before this call may not have reached the
    /// reconciler yet (queued in the kernel, or read and not yet pushed).
    fn pending(&self) -> bool {
        self.inner.lock().map(|r| r.pending()).unwrap_or(false)
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().map(|r| r.is_closed()).unwrap_or(true)
    }

    /// Counters: datagrams, bytes, rejected_uid, last_rejected_uid, accepted_foreign,
    /// oversized, batches, errors, rcvbuf.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("receiver poisoned"))?
            .stats();
        let d = PyDict::new(py);
        d.set_item("datagrams", st.received)?;
        d.set_item("bytes", st.bytes)?;
        d.set_item("rejected_uid", st.rejected_uid)?;
        d.set_item("last_rejected_uid", st.last_rejected_uid)?;
        d.set_item("accepted_foreign", st.accepted_foreign)?;
        d.set_item("oversized", st.oversized)?;
        d.set_item("batches", st.batches)?;
        d.set_item("errors", st.errors)?;
        d.set_item("rcvbuf", st.rcvbuf)?;
        Ok(d)
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}
