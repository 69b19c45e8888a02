//! `HttpStreams`: the HTTP thread of a run (rust/core/src/http/).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use parallelhue_core::http::{self, request_bytes, Target, Timeouts};
use parallelhue_core::outcome::{EndKind, Outcome};
use parallelhue_core::sse::Usage;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::value_error;
use crate::reconciler::Reconciler;

pub(crate) fn usage_dict<'py>(py: Python<'py>, u: &Usage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("prompt_tokens", u.prompt_tokens)?;
    d.set_item("completion_tokens", u.completion_tokens)?;
    d.set_item("total_tokens", u.total_tokens)?;
    Ok(d)
}

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    if value > 0.0 && value.is_finite() {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(value_error(format!("{name} must be positive, got {value}")))
    }
}

/// Every stream's HTTP exchange, done by one Rust thread without the GIL;
/// deltas and ends go into `reconciler` (see `Reconciler.take`).
#[pyclass(module = "parallelhue._native", frozen)]
pub(crate) struct HttpStreams {
    inner: Mutex<http::HttpStreams>,
    reconciler: Py<Reconciler>,
}

impl HttpStreams {
    fn lock(&self) -> PyResult<MutexGuard<'_, http::HttpStreams>> {
        self.inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("HTTP streams poisoned"))
    }
}

#[pymethods]
impl HttpStreams {
    #[new]
    #[pyo3(signature = (reconciler, host, port, tls, shown, connect_timeout, read_timeout, write_timeout = 30.0, min_interval = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        reconciler: &Bound<'_, Reconciler>,
        host: String,
        port: u16,
        tls: bool,
        shown: String,
        connect_timeout: f64,
        read_timeout: Option<f64>,
        write_timeout: f64,
        min_interval: Option<f64>,
    ) -> PyResult<Self> {
        let min_interval = match min_interval {
            None => http::DEFAULT_MIN_INTERVAL,
            Some(t) if (0.0..=1.0).contains(&t) => Duration::from_secs_f64(t),
            Some(t) => {
                return Err(value_error(format!(
                    "min_interval must be between 0 and 1 s, got {t}"
                )))
            }
        };
        let timeouts = Timeouts {
            connect: seconds("connect_timeout", connect_timeout)?,
            read: read_timeout
                .map(|t| seconds("read_timeout", t))
                .transpose()?,
            write: seconds("write_timeout", write_timeout)?,
        };
        if host.is_empty() {
            return Err(value_error("host must not be empty"));
        }
        let target = Target {
            host,
            port,
            tls,
            shown,
        };
        let fed = Arc::clone(&reconciler.get().inner);
        let inner = http::HttpStreams::start(fed, target, timeouts, min_interval)?;
        Ok(HttpStreams {
            inner: Mutex::new(inner),
            reconciler: reconciler.clone().unbind(),
        })
    }

    /// Start `stream`: `method target HTTP/1.1`, the headers (Connection,
    /// Content-Length and Transfer-Encoding are set by the thread), `body`.
    /// Returns its start time (time.monotonic's clock), as recorded.
    /// ValueError for a stream the reconciler would refuse (its message) or a
    /// header that would break the request.
    fn add(
        &self,
        stream: &Bound<'_, PyAny>,
        method: &str,
        target: &str,
        headers: Vec<(String, String)>,
        body: &[u8],
    ) -> PyResult<f64> {
        let stream = self.reconciler.get().stream(stream)?;
        let request = request_bytes(method, target, &headers, body).map_err(value_error)?;
        Ok(self.lock()?.add(stream, request))
    }

    /// Stop `stream`: its connection closes and it ends as "cancelled" (also
    /// when its exchange was already over: the recording says so).
    fn cancel(&self, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = self.reconciler.get().stream(stream)?;
        self.lock()?.cancel(stream);
        Ok(())
    }

    /// End `stream` as failed by the client ("internal", with `detail`):
    /// Python could not handle what it received. Recorded like any end.
    fn fail(&self, stream: &Bound<'_, PyAny>, detail: &str) -> PyResult<()> {
        let stream = self.reconciler.get().stream(stream)?;
        self.lock()?
            .stop(stream, Outcome::failed(EndKind::Internal, detail));
        Ok(())
    }

    /// Stop the thread and close every connection. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            if let Ok(mut r) = self.inner.lock() {
                r.close();
            }
        });
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.lock().map(|r| r.is_closed()).unwrap_or(true)
    }

    /// The thread died (a bug): the streams it held will never end.
    #[getter]
    fn failed(&self) -> bool {
        self.inner.lock().map(|r| r.has_failed()).unwrap_or(true)
    }
}
