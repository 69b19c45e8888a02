//! `--record`: the tap on the reconciler's inputs.
//!
//! [`crate::fed::Fed`] calls the tap inside the reconciler's lock, just before
//! each input is applied, so the recording holds the inputs in the order the
//! reconciler applied them — frames from the receiver thread and SSE deltas
//! from the HTTP thread interleaved as they really were. Inside the lock the
//! tap only appends the encoded item to a buffer; full buffers go to a writer
//! thread that compresses and writes them, so recording never holds the lock
//! for I/O (and never blocks a sender: the hand-over queue is unbounded).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::record::{self, Item};

/// Encoded bytes gathered before they go to the writer thread.
const HAND_OVER_BYTES: usize = 256 * 1024;

/// A recording being written.
pub struct Tap {
    /// Times in the recording are seconds since this instant.
    origin: f64,
    buf: Vec<u8>,
    to_writer: Option<Sender<Vec<u8>>>,
    writer: Option<JoinHandle<io::Result<()>>>,
}

fn write_all(file: File, chunks: mpsc::Receiver<Vec<u8>>) -> io::Result<()> {
    // zlib-rs at level 1: about a third of the CPU of miniz at level 3 for a
    // file about 40 % larger (docs/benchmarks/record.md).
    let mut gz = GzEncoder::new(BufWriter::with_capacity(1 << 20, file), Compression::fast());
    let mut failed: Option<io::Error> = None;
    for chunk in chunks {
        if failed.is_none() {
            if let Err(e) = gz.write_all(&chunk) {
                failed = Some(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    gz.finish()?.flush()
}

impl Tap {
    /// Create `path` and write the preamble and `header_json`. `origin` is the
    /// monotonic time the recording's times count from.
    pub fn create(path: &Path, header_json: &str, origin: f64) -> io::Result<Tap> {
        let file = File::create(path)?;
        let (tx, rx) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("parallelhue-record".into())
            .spawn(move || write_all(file, rx))?;
        let mut tap = Tap {
            origin,
            buf: Vec::with_capacity(HAND_OVER_BYTES + 64 * 1024),
            to_writer: Some(tx),
            writer: Some(writer),
        };
        tap.buf.extend_from_slice(&record::preamble());
        tap.item(origin, &Item::Header(header_json));
        Ok(tap)
    }

    fn at(&self, monotonic: f64) -> f64 {
        // Not rounded: a replay's differences of times (TTFT, gaps) are then
        // the live run's to within float rounding.
        (monotonic - self.origin).max(0.0)
    }

    fn hand_over_if_full(&mut self) {
        if self.buf.len() >= HAND_OVER_BYTES {
            self.hand_over();
        }
    }

    fn hand_over(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(HAND_OVER_BYTES + 65536));
        if let Some(tx) = &self.to_writer {
            // A writer that died keeps its error for close().
            let _ = tx.send(full);
        }
    }

    /// Record one item at monotonic time `at`.
    pub fn item(&mut self, at: f64, item: &Item<'_>) {
        let t = self.at(at);
        record::encode_item(&mut self.buf, t, item);
        self.hand_over_if_full();
    }

    /// Record an SSE delta given as token ids.
    pub fn sse(&mut self, at: f64, stream: u16, text: &str, ids: &[u32]) {
        let t = self.at(at);
        record::encode_sse(&mut self.buf, t, stream, text, ids);
        self.hand_over_if_full();
    }

    /// Write the footer (None: an interrupted run, no footer) and finish the
    /// file; the first write error, if any.
    pub fn close(mut self, at: f64, footer_json: Option<&str>) -> io::Result<()> {
        if let Some(footer) = footer_json {
            self.item(at, &Item::Footer(footer));
        }
        self.hand_over();
        drop(self.to_writer.take());
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("the recording's writer thread panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.hand_over();
        drop(self.to_writer.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn writes_preamble_header_items_and_footer_gzipped() {
        let dir = std::env::temp_dir().join(format!("ph-tap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.phr");
        let mut tap = Tap::create(&path, "{\"h\":1}", 100.0).unwrap();
        tap.sse(100.25, 1, "hi", &[7, 8]);
        // Enough frames to cross several hand-overs.
        let frame = vec![0xAB; 1000];
        for i in 0..600 {
            tap.item(100.5 + i as f64 * 1e-3, &Item::Frame(&frame));
        }
        tap.item(101.0, &Item::Finalize);
        tap.close(101.5, Some("{\"f\":2}")).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(File::open(&path).unwrap())
            .read_to_end(&mut raw)
            .unwrap();
        let body = record::check_preamble(&raw).unwrap();
        let mut seen = Vec::new();
        record::decode_items(body, |t, item| {
            seen.push(match item {
                Item::Header(h) => format!("{t} header {h}"),
                Item::Sse { stream, text, ids } => {
                    let ids: Vec<u32> = Item::token_ids(ids).collect();
                    format!("{t} sse {stream} {text} {ids:?}")
                }
                Item::Frame(f) => format!("frame {}", f.len()),
                Item::Finalize => format!("{t} finalize"),
                Item::Footer(f) => format!("{t} footer {f}"),
                other => format!("{other:?}"),
            })
        })
        .unwrap();
        assert_eq!(seen.len(), 604);
        assert_eq!(seen[0], "0 header {\"h\":1}");
        assert_eq!(seen[1], "0.25 sse 1 hi [7, 8]");
        assert_eq!(seen[2], "frame 1000");
        assert_eq!(&seen[602..], ["1 finalize", "1.5 footer {\"f\":2}"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_path_is_an_error_at_once() {
        let e = Tap::create(Path::new("/nonexistent-dir/x.phr"), "{}", 0.0)
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
