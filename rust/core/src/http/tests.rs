//! The HTTP thread against real sockets: local servers that answer in
//! pieces, fail, stall or close.

use std::io::{self, BufRead, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::thread::ReadOptions;
use super::*;
use crate::fed::{monotonic, Batch, Fed};
use crate::outcome::{EndKind, Outcome};
use crate::reconcile::Reconciler;

/// A server that answers connection `i` with `answers[i]` (written in
/// 7-byte pieces when `dribble`), keeping each request it read.
fn serve(answers: Vec<Vec<u8>>, dribble: bool) -> (u16, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    std::thread::spawn(move || {
        for answer in answers {
            let Ok((conn, _)) = listener.accept() else {
                return;
            };
            let kept = Arc::clone(&kept);
            std::thread::spawn(move || {
                let mut reader = io::BufReader::new(conn.try_clone().unwrap());
                let mut request = Vec::new();
                let mut length = 0;
                loop {
                    let mut line = Vec::new();
                    if reader.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
                    if let Some(v) = text.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    request.extend_from_slice(&line);
                    if line == b"\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                request.extend_from_slice(&body);
                kept.lock().unwrap().push(request);
                let mut conn = conn;
                if dribble {
                    for piece in answer.chunks(7) {
                        if conn.write_all(piece).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                } else {
                    let _ = conn.write_all(&answer);
                }
                if answer.ends_with(b"\r\n\r\n") {
                    // A head alone: stay silent until the client gives up.
                    std::thread::sleep(Duration::from_millis(1500));
                }
            });
        }
    });
    (port, seen)
}

fn chunked(parts: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(format!("{:x}\r\n{p}\r\n", p.len()).as_bytes());
    }
    out
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

fn event(text: &str, ids: &[u32], finish: Option<&str>) -> String {
    let finish = finish.map_or("null".into(), |f| format!("\"{f}\""));
    format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{text:?}}},\"token_ids\":{ids:?},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

struct Run {
    fed: Arc<Mutex<Fed>>,
    streams: HttpStreams,
}

fn run(port: u16, n: u16, read: Option<Duration>) -> Run {
    run_with(port, n, read, ReadOptions::default())
}

fn run_with(port: u16, n: u16, read: Option<Duration>, options: ReadOptions) -> Run {
    let fed = Arc::new(Mutex::new(Fed::new(Reconciler::with_run_id([1; 16], n))));
    let target = Target {
        host: "127.0.0.1".into(),
        port,
        tls: false,
        shown: format!("127.0.0.1:{port}"),
    };
    let timeouts = Timeouts {
        connect: Duration::from_secs(5),
        read,
        write: Duration::from_secs(5),
    };
    let interval = Duration::from_millis(1);
    let streams =
        HttpStreams::start_with(Arc::clone(&fed), target, timeouts, interval, options).unwrap();
    Run { fed, streams }
}

fn request(n: u16) -> Vec<u8> {
    let headers = vec![
        ("Host".to_string(), "127.0.0.1".to_string()),
        ("Connection".to_string(), "keep-alive".to_string()),
    ];
    crate::http::request_bytes(
        "POST",
        "/v1/x?q=1",
        &headers,
        format!("{{\"s\":{n}}}").as_bytes(),
    )
    .unwrap()
}

/// Collect batches until `n` streams ended.
fn collect(run: &Run, n: usize) -> Batch {
    let mut all = Batch::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while all.ends.len() < n && Instant::now() < deadline {
        let b = run.fed.lock().unwrap().take();
        all.texts.extend(b.texts);
        all.ends.extend(b.ends);
        all.events.extend(b.events);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(all.ends.len(), n, "streams did not end in time");
    all.ends.sort_by_key(|e| e.stream);
    all
}

#[test]
fn a_stream_split_anywhere_is_reconciled_queued_and_finished() {
    let body = [
        event("h\u{e9}", &[5, 6], None),
        event("", &[7], None),
        event("\u{4e16}!", &[8], Some("stop")),
        "data: [DONE]\n\n".into(),
    ];
    let parts: Vec<&str> = body.iter().map(String::as_str).collect();
    let mut answer = SSE_HEAD.as_bytes().to_vec();
    answer.extend(chunked(&parts));
    answer.extend_from_slice(b"0\r\n\r\n");
    let (port, requests) = serve(vec![answer], true);
    let mut r = run(port, 2, None);
    let before = monotonic();
    r.streams.add(1, request(1));
    let batch = collect(&r, 1);
    let after = monotonic();
    let end = &batch.ends[0];
    assert_eq!(end.outcome, Outcome::finished());
    assert_eq!(end.finish_reason.as_deref(), Some("stop"));
    let text: Vec<u8> = batch
        .texts
        .iter()
        .flat_map(|(_, t)| t.utf8.clone())
        .collect();
    assert_eq!(text, "h\u{e9}\u{4e16}!".as_bytes());
    let times: Vec<f64> = batch
        .texts
        .iter()
        .flat_map(|(_, t)| t.times.clone())
        .collect();
    let tokens: u64 = batch.texts.iter().map(|(_, t)| t.tokens).sum();
    assert_eq!((times.len(), tokens), (3, 4));
    assert!(before <= times[0] && times[2] <= after && times.windows(2).all(|w| w[0] <= w[1]));
    // The reconciler holds what a twin fed the same deltas holds.
    let mut twin = Reconciler::with_run_id([1; 16], 2);
    twin.push_sse_id(1, ""); // the chunks have no id
    twin.push_sse(1, "h\u{e9}", &[5, 6]);
    twin.push_sse(1, "", &[7]);
    twin.push_sse(1, "\u{4e16}!", &[8]);
    twin.finish_sse(1, Some("stop"));
    assert_eq!(r.fed.lock().unwrap().retained(), twin.retained());
    let sent = String::from_utf8(requests.lock().unwrap()[0].clone()).unwrap();
    assert_eq!(
        sent,
        "POST /v1/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 7\r\n\
         Connection: close\r\n\r\n{\"s\":1}"
    );
    r.streams.close();
    assert!(r.streams.is_closed());
}

fn ends_of(answers: Vec<Vec<u8>>, read: Option<Duration>) -> Vec<(Option<EndKind>, u16, String)> {
    let n = answers.len() as u16;
    let (port, _) = serve(answers, false);
    let mut r = run(port, n, read);
    for s in 0..n {
        r.streams.add(s, request(s));
    }
    let batch = collect(&r, n as usize);
    r.streams.close();
    batch
        .ends
        .into_iter()
        .map(|e| (e.outcome.kind, e.outcome.status, e.outcome.detail))
        .collect()
}

#[test]
fn every_other_end_is_reported_precisely() {
    let first = event("a", &[1], None);
    let sse = |tail: &[u8]| {
        let mut a = SSE_HEAD.as_bytes().to_vec();
        a.extend(chunked(&[&first]));
        a.extend_from_slice(tail);
        a
    };
    let bad_event = "data: {oops\n\n";
    let answers = vec![
        // 100 Continue, then a chunked JSON error.
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Oops\r\ncontent-type: application/json\r\n\
          transfer-encoding: chunked\r\n\r\n9\r\n{\"error\":\r\n8\r\n \"boom\"}\r\n0\r\n\r\n"
            .to_vec(),
        b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: 2\r\n\r\nhi"
            .to_vec(),
        sse(b""),
        sse(b"zz\r\n"),
        sse(format!("{:x}\r\n{bad_event}\r\n", bad_event.len()).as_bytes()),
        sse(b"0\r\n\r\n"),
        b"HTTP/2 200 OK\r\n\r\n".to_vec(),
        Vec::new(),
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n\r\n"
            .to_vec(),
    ];
    let ends = ends_of(answers, Some(Duration::from_millis(300)));
    assert_eq!(
        ends,
        vec![
            (
                Some(EndKind::HttpStatus),
                500,
                "{\"error\": \"boom\"}".into()
            ),
            (
                Some(EndKind::NotSse),
                200,
                "text/html; charset=utf-8".into()
            ),
            (Some(EndKind::Closed), 0, String::new()),
            (
                Some(EndKind::Framing),
                0,
                "invalid chunk size line \"zz\" in a chunked body".into()
            ),
            (
                Some(EndKind::BadSse),
                0,
                "invalid JSON in SSE data: key must be a string at line 1 column 2".into()
            ),
            (Some(EndKind::NoFinish), 0, String::new()),
            (
                Some(EndKind::Protocol),
                0,
                "not an HTTP/1.x status line: 'HTTP/2 200 OK'".into()
            ),
            (Some(EndKind::NoResponse), 0, String::new()),
            (Some(EndKind::Encoding), 0, "gzip".into()),
        ]
    );
}

/// One connection answered with `answer` in one write, then held open
/// silently for `hold`: no data, no close.
fn serve_then_hold(answer: Vec<u8>, hold: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        // The request: its head, then a body of 7 bytes ({"s":1}).
        while !seen.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
            seen.push(byte[0]);
        }
        let mut body = [0u8; 7];
        let _ = conn.read_exact(&mut body);
        conn.write_all(&answer).unwrap();
        std::thread::sleep(hold);
    });
    port
}

/// A read cut by the per-round cap (4 reads of 64 bytes here) leaves bytes
/// in the socket and no new event will come: the rest is read in the next
/// rounds all the same (an edge-triggered wait that forgot the socket was
/// still readable would stall until the server closes, 5 s later).
#[test]
fn a_read_cut_by_the_round_cap_goes_on_without_new_data() {
    let texts: Vec<String> = (0..80).map(|i| format!("piece {i:02} ")).collect();
    let mut body: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| event(t, &[i as u32 + 5], (i == 79).then_some("stop")))
        .collect();
    body.push("data: [DONE]\n\n".into());
    let parts: Vec<&str> = body.iter().map(String::as_str).collect();
    let mut answer = SSE_HEAD.as_bytes().to_vec();
    answer.extend(chunked(&parts));
    answer.extend_from_slice(b"0\r\n\r\n");
    assert!(
        answer.len() > 20 * 4 * 64,
        "{} bytes: 20 capped rounds",
        answer.len()
    );
    for edges in [true, false] {
        let port = serve_then_hold(answer.clone(), Duration::from_secs(5));
        let options = ReadOptions {
            read_bytes: 64,
            edges,
        };
        let mut r = run_with(port, 2, None, options);
        let started = Instant::now();
        r.streams.add(1, request(1));
        let batch = collect(&r, 1);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "edges {edges}: stalled"
        );
        assert_eq!(batch.ends[0].outcome, Outcome::finished(), "edges {edges}");
        assert_eq!(batch.ends[0].finish_reason.as_deref(), Some("stop"));
        let text: Vec<u8> = batch
            .texts
            .iter()
            .flat_map(|(_, t)| t.utf8.clone())
            .collect();
        assert_eq!(text, texts.concat().as_bytes(), "edges {edges}");
        r.streams.close();
    }
}

#[test]
fn refused_timeout_and_cancel() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut r = run(port, 1, None);
    r.streams.add(0, request(0));
    let batch = collect(&r, 1);
    assert_eq!(
        batch.ends[0].outcome,
        Outcome::failed(EndKind::Refused, format!("127.0.0.1:{port}"))
    );
    r.streams.close();

    // A server that answers the head, then stays silent.
    let silent = SSE_HEAD.as_bytes().to_vec();
    let (port, _) = serve(vec![silent.clone(), silent], false);
    let mut r = run(port, 2, Some(Duration::from_millis(150)));
    let started = Instant::now();
    r.streams.add(0, request(0));
    let batch = collect(&r, 1);
    assert_eq!(batch.ends[0].outcome.kind, Some(EndKind::ReadTimeout));
    assert!(started.elapsed() >= Duration::from_millis(140));
    r.streams.close();

    let (port, _) = serve(vec![SSE_HEAD.as_bytes().to_vec()], false);
    let mut r = run(port, 1, None);
    r.streams.add(0, request(0));
    std::thread::sleep(Duration::from_millis(50));
    r.streams.cancel(0);
    let batch = collect(&r, 1);
    assert_eq!(batch.ends[0].outcome.kind, Some(EndKind::Cancelled));
    r.streams.close();
}

/// One `event: parallelhue` SSE event of `items` (docs/PROTOCOL.md, "In-band telemetry").
fn inband_event(items: &[u8]) -> String {
    let data = crate::telemetry::inband::tests::encode(items);
    format!("event: parallelhue\ndata: {data}\n\n")
}

/// `event` whose chunk carries stream `s`'s request id in its `id`, as vLLM's does
/// (the reconciler checks it once frames are in).
fn event_of(s: u16, text: &str, ids: &[u32], finish: Option<&str>) -> String {
    let id = format!("{{\"id\":\"chatcmpl-ph1_{}_{s}\",", "01".repeat(16));
    event(text, ids, finish).replacen('{', &id, 1)
}

fn item(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The SSE reader hands in-band frames to the run like datagrams, in order with
/// the stream's chunks; an end item that says frames are missing fails that
/// stream only, with the reason.
#[test]
fn in_band_frames_reach_the_run_and_a_loss_fails_its_own_stream() {
    // Not a valid frame: the run says so, which shows it reached the reconciler.
    let mut frame = b"PHUE".to_vec();
    frame.extend_from_slice(&[0; 60]);
    let mut end = Vec::new();
    for v in [1u16, 0] {
        end.extend_from_slice(&v.to_le_bytes()); // status 1 (scheduler missing), reserved
    }
    for v in [1u32, 0, 2_000_000] {
        end.extend_from_slice(&v.to_le_bytes()); // frames, dropped, waited_us
    }
    let lossy = [
        inband_event(&item(1, &frame)),
        event_of(0, "a", &[5], Some("stop")),
        inband_event(&item(2, &end)),
        "data: [DONE]\n\n".to_string(),
    ];
    let fine = [
        event_of(1, "b", &[6], Some("stop")),
        "data: [DONE]\n\n".to_string(),
    ];
    let mut answers = Vec::new();
    for events in [&lossy[..], &fine[..]] {
        let mut answer = SSE_HEAD.as_bytes().to_vec();
        let parts: Vec<&str> = events.iter().map(String::as_str).collect();
        answer.extend(chunked(&parts));
        answer.extend_from_slice(b"0\r\n\r\n");
        answers.push(answer);
    }
    let (port, _) = serve(answers, true);
    let r = run(port, 2, Some(Duration::from_secs(5)));
    r.streams.add(0, request(0));
    let batch = collect(&r, 1);
    r.streams.add(1, request(1));
    let second = collect(&r, 1);
    let reason =
        "telemetry lost: the scheduler's frames of the final step did not come within 2000 ms";
    let failed: Vec<_> = batch
        .events
        .iter()
        .chain(&second.events)
        .filter_map(|e| match e {
            crate::reconcile::Event::Failed { stream, reason } => Some((*stream, reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(failed, vec![(0, reason.to_string())]);
    let rejected = batch
        .events
        .iter()
        .filter(|e| matches!(e, crate::reconcile::Event::Run { message } if message.starts_with("rejected frame: ")))
        .count();
    assert_eq!(rejected, 1);
    let mut streams = r.streams;
    streams.close();
}
