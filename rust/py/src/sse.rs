//! `SseParser`: the incremental OpenAI SSE parser.

use parallelhue_core::sse::{self, SseError, SseEvent};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

fn sse_event_dict<'py>(
    py: Python<'py>,
    e: Result<SseEvent, SseError>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match e {
        Ok(SseEvent::Done) => d.set_item("kind", "done")?,
        Ok(SseEvent::Other { event, data }) => {
            d.set_item("kind", "other")?;
            d.set_item("event", event)?;
            d.set_item("data", data)?;
        }
        Err(err) => {
            d.set_item("kind", "error")?;
            d.set_item("message", err.to_string())?;
        }
        Ok(SseEvent::Chunk(c)) => {
            d.set_item("kind", "chunk")?;
            d.set_item("id", c.id)?;
            let choices = PyList::empty(py);
            for ch in c.choices {
                let cd = PyDict::new(py);
                cd.set_item("index", ch.index)?;
                cd.set_item("text", ch.text)?;
                cd.set_item("token_ids", ch.token_ids)?;
                cd.set_item("finish_reason", ch.finish_reason)?;
                choices.append(cd)?;
            }
            d.set_item("choices", choices)?;
            match c.usage {
                None => d.set_item("usage", py.None())?,
                Some(u) => d.set_item("usage", usage_dict(py, &u)?)?,
            }
        }
    }
    Ok(d)
}

/// Incremental parser of an OpenAI chat/completions SSE body.
#[pyclass(module = "parallelhue._native")]
pub(crate) struct SseParser {
    inner: sse::SseParser,
}

#[pymethods]
impl SseParser {
    #[new]
    fn new() -> Self {
        SseParser {
            inner: sse::SseParser::new(),
        }
    }

    /// Feed body bytes (split anywhere); returns the events they complete.
    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let events = self.inner.feed(data);
        let list = PyList::empty(py);
        for e in events {
            list.append(sse_event_dict(py, e)?)?;
        }
        Ok(list)
    }

    /// The body ended: reports an unterminated event as an error.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.inner.finish();
        let list = PyList::empty(py);
        for e in events {
            list.append(sse_event_dict(py, e)?)?;
        }
        Ok(list)
    }
}

pub(crate) fn usage_dict<'py>(py: Python<'py>, u: &sse::Usage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("prompt_tokens", u.prompt_tokens)?;
    d.set_item("completion_tokens", u.completion_tokens)?;
    d.set_item("total_tokens", u.total_tokens)?;
    Ok(d)
}
