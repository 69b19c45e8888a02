//! Instructions per response head: `Head::parse` (httparse) against the
//! hand-written parser it replaced, kept here as the baseline.
//! `cargo run --release -p parallelhue-core --example head_parse_cost -- PARSER SHAPE N`
//! PARSER: hand | httparse; SHAPE: vllm (the 4 headers uvicorn sends for a
//! stream) | h16 (16 headers); N parses (0 gives the fixed cost to subtract).
//! Run under `valgrind --tool=callgrind`; docs/BENCHMARKS.md has the numbers.
use parallelhue_core::http::{Head, HeadError};
use std::hint::black_box;

const VLLM: &[u8] = b"HTTP/1.1 200 OK\r\n\
date: Sun, 06 Dec 2026 09:00:00 GMT\r\n\
server: uvicorn\r\n\
content-type: text/event-stream; charset=utf-8\r\n\
transfer-encoding: chunked";

fn sixteen() -> Vec<u8> {
    let mut head = b"HTTP/1.1 200 OK\r\n\
date: Sun, 06 Dec 2026 09:00:00 GMT\r\n\
server: uvicorn\r\n\
content-type: text/event-stream; charset=utf-8\r\n\
transfer-encoding: chunked"
        .to_vec();
    for i in 0..12 {
        head.extend_from_slice(format!("\r\nx-extra-header-{i}: value-{i}-abcdefgh").as_bytes());
    }
    head
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [parser, shape, n] = args.as_slice() else {
        panic!("usage: head_parse_cost hand|httparse vllm|h16 N");
    };
    let parse: fn(&[u8]) -> Result<Head, HeadError> = match parser.as_str() {
        "hand" => hand_parse,
        "httparse" => Head::parse,
        other => panic!("unknown parser {other}"),
    };
    let head = match shape.as_str() {
        "vllm" => VLLM.to_vec(),
        "h16" => sixteen(),
        other => panic!("unknown shape {other}"),
    };
    assert_eq!(
        hand_parse(&head),
        Head::parse(&head),
        "the parsers disagree"
    );
    let n: usize = n.parse().expect("N must be a number");
    let mut statuses = 0usize;
    for _ in 0..n {
        let parsed = parse(black_box(&head)).expect("the head parses");
        statuses += usize::from(parsed.status) + parsed.headers.len();
    }
    println!("{parser} {shape} {n}: {statuses}");
}

/// The hand-written parser (before httparse), errors without the offending
/// line: the bench only feeds valid heads.
fn hand_parse(raw: &[u8]) -> Result<Head, HeadError> {
    let bad = || HeadError("bad head".into());
    let mut lines = raw
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().unwrap_or(b"");
    let mut parts = first.splitn(3, |&b| b == b' ');
    let version = parts.next().unwrap_or(b"");
    let code = parts.next().unwrap_or(b"");
    let reason = parts.next().unwrap_or(b"");
    if !version.starts_with(b"HTTP/1.") || code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let status = std::str::from_utf8(code)
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    let mut headers = Vec::new();
    for line in lines {
        if line.is_empty() {
            continue;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(bad());
        }
        let colon = line.iter().position(|&b| b == b':').ok_or_else(bad)?;
        let name = &line[..colon];
        if name.is_empty() || name.trim_ascii() != name {
            return Err(bad());
        }
        headers.push((
            String::from_utf8_lossy(name).into_owned(),
            line[colon + 1..].trim_ascii().to_vec(),
        ));
    }
    Ok(Head {
        status,
        reason: String::from_utf8_lossy(reason).into_owned(),
        headers,
    })
}
