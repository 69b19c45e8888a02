//! A deterministic synthetic workload (tests and benchmarks): many streams of
//! mixed ASCII, accented, CJK and emoji text, cut into byte-level tokens that
//! split multi-byte characters across tokens and steps, decoded in speculative
//! steps of 1..=K+1 tokens, with one SSE chunk per step or several steps
//! coalesced into one chunk.

use crate::encode::{HelloFields, ProvRec, Sender, TextRec, TextTok};
use crate::protocol::{ROLE_ACCEPTED, ROLE_BONUS, ROLE_PLAIN, ROLE_TARGET};
use crate::reconcile::{ROLE_FRONTEND, ROLE_SCHEDULER};

/// Workload shape.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub streams: u16,
    pub tokens_per_stream: u32,
    /// K: drafts per step; steps carry 1..=K+1 tokens.
    pub k: u16,
    /// Steps merged into one SSE chunk (1: one chunk per step).
    pub coalesce: u32,
    pub seed: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            streams: 64,
            tokens_per_stream: 2_000,
            k: 5,
            coalesce: 1,
            seed: 1,
        }
    }
}

/// One input to the reconciler, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Frame(Vec<u8>),
    Sse {
        stream: u16,
        text: String,
        token_ids: Vec<u32>,
    },
    /// The stream's SSE chunk id (pushed once: it never changes).
    SseId {
        stream: u16,
        id: String,
    },
    FinishSse {
        stream: u16,
        reason: Option<String>,
    },
}

/// The generated inputs plus what the reconciler should conclude.
#[derive(Clone, Debug)]
pub struct Workload {
    pub run_id: [u8; 16],
    pub inputs: Vec<Input>,
    /// Each stream's full text.
    pub texts: Vec<String>,
    pub total_tokens: u64,
}

/// splitmix64.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

const PIECES: [&str; 12] = [
    "the ",
    "quick ",
    "fox ",
    "caf\u{e9} ",
    "na\u{ef}ve ",
    "\u{6f22}\u{5b57}",
    "\u{65e5}\u{672c}\u{8a9e} ",
    "\u{d55c}\u{ad6d}\u{c5b4}",
    "\u{1f600}",
    "\u{1f680} ",
    "\u{1f468}\u{200d}\u{1f469}\u{200d}\u{1f467}",
    "\n",
];

/// A detokenizer as vLLM's incremental one: while the text so far ends
/// inside a character it returns nothing; the token that completes it
/// returns every pending byte.
#[derive(Default)]
struct Detok {
    pending: Vec<u8>,
    empties: u8,
}

impl Detok {
    /// Feed a token's bytes: its fragment, span_back and lead_len (for an
    /// empty fragment its give count: all its bytes go to the next fragment).
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, u8, u16) {
        let lead = self.pending.len() as u16;
        self.pending.extend_from_slice(bytes);
        if std::str::from_utf8(&self.pending).is_err() {
            self.empties = self.empties.saturating_add(1);
            return (Vec::new(), 0, bytes.len() as u16);
        }
        let frag = std::mem::take(&mut self.pending);
        let back = std::mem::take(&mut self.empties);
        (frag, back, if back == 0 { 0 } else { lead })
    }
}

struct Gen {
    tokens: Vec<(u32, Vec<u8>)>,
    /// Steps as token counts.
    steps: Vec<u32>,
}

fn gen_stream(rng: &mut Rng, n_tokens: u32, k: u16) -> Gen {
    let mut bytes = Vec::new();
    while bytes.len() < n_tokens as usize * 3 + 8 {
        bytes.extend_from_slice(PIECES[rng.range(0, PIECES.len() as u64 - 1) as usize].as_bytes());
    }
    let mut tokens = Vec::with_capacity(n_tokens as usize);
    let mut pos = 0usize;
    for _ in 0..n_tokens {
        let len = rng.range(1, 3) as usize;
        let t = bytes[pos..pos + len].to_vec();
        pos += len;
        let mut id = 0u32;
        for &b in &t {
            id = id.wrapping_mul(257).wrapping_add(u32::from(b));
        }
        tokens.push((id % 50_000 + len as u32, t));
    }
    // Make the text end on a character boundary: pad the last token.
    while std::str::from_utf8(&bytes[..pos]).is_err() {
        tokens.last_mut().expect("tokens").1.push(bytes[pos]);
        pos += 1;
    }
    let mut steps = Vec::new();
    let mut left = n_tokens;
    let mut first = true;
    while left > 0 {
        let n = if first || k == 0 {
            1
        } else {
            rng.range(1, u64::from(k) + 1) as u32
        }
        .min(left);
        first = false;
        steps.push(n);
        left -= n;
    }
    Gen { tokens, steps }
}

/// The roles of one step of `cnt` tokens with `ds` drafts scheduled.
fn step_roles(ds: u16, cnt: u32) -> Vec<u8> {
    if ds == 0 {
        vec![ROLE_PLAIN]
    } else {
        let mut r = vec![ROLE_ACCEPTED; cnt as usize - 1];
        r.push(if cnt as u16 == ds + 1 {
            ROLE_BONUS
        } else {
            ROLE_TARGET
        });
        r
    }
}

/// One step's text tokens as the detokenizer reports them, and their HTTP bytes.
fn text_tokens(detok: &mut Detok, toks: &[(u32, Vec<u8>)]) -> (Vec<TextTok>, Vec<u8>) {
    let mut ttoks = Vec::with_capacity(toks.len());
    let mut http = Vec::new();
    for (id, b) in toks {
        let (frag, back, lead) = detok.feed(b);
        http.extend_from_slice(&frag);
        ttoks.push(TextTok {
            token_id: *id,
            fragment: frag,
            span_back: back,
            lead_len: lead,
        });
    }
    (ttoks, http)
}

/// Generate a workload.
pub fn generate(cfg: &WorkloadConfig) -> Workload {
    let mut rng = Rng(cfg.seed);
    let mut run_id = [0u8; 16];
    for b in run_id.iter_mut() {
        *b = rng.next_u64() as u8;
    }
    let gens: Vec<Gen> = (0..cfg.streams)
        .map(|_| gen_stream(&mut rng, cfg.tokens_per_stream, cfg.k))
        .collect();
    let mut sched = Sender::new(run_id, 0x5c4e_d000_0000_0001);
    let mut front = Sender::new(run_id, 0xf10e_0000_0000_0002);
    let mut inputs = vec![
        Input::Frame(sched.hello(&HelloFields::simulated(ROLE_SCHEDULER, cfg.k))),
        Input::Frame(front.hello(&HelloFields::simulated(ROLE_FRONTEND, cfg.k))),
    ];
    let n = cfg.streams as usize;
    let mut step_idx = vec![0usize; n];
    let mut tok_off = vec![0u32; n];
    let mut detoks: Vec<Detok> = (0..n).map(|_| Detok::default()).collect();
    let mut sse_text: Vec<String> = vec![String::new(); n];
    let mut sse_ids: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut chunk_sent = vec![false; n];
    let mut texts = vec![String::new(); n];
    let mut step = 0u64;
    loop {
        let mut prov = Vec::new();
        let mut text = Vec::new();
        for s in 0..n {
            let g = &gens[s];
            let Some(&cnt) = g.steps.get(step_idx[s]) else {
                continue;
            };
            let last = step_idx[s] + 1 == g.steps.len();
            let off = tok_off[s];
            let toks = &g.tokens[off as usize..(off + cnt) as usize];
            let ds = if off == 0 || cfg.k == 0 { 0 } else { cfg.k };
            let roles = step_roles(ds, cnt);
            let (flags, reason) = if last { (1, 2) } else { (0, 0) };
            prov.push(ProvRec {
                stream: s as u16,
                flags,
                finish_reason: reason,
                offset: off,
                drafts_scheduled: ds,
                drafts_padded: 0,
                token_ids: toks.iter().map(|t| t.0).collect(),
                roles,
            });
            let (ttoks, http) = text_tokens(&mut detoks[s], toks);
            let delta = String::from_utf8(http.clone()).expect("complete characters");
            texts[s].push_str(&delta);
            sse_text[s].push_str(&delta);
            sse_ids[s].extend(toks.iter().map(|t| t.0));
            text.push(TextRec {
                stream: s as u16,
                flags,
                finish_reason: reason,
                offset: off,
                trimmed_tokens: 0,
                tokens: ttoks,
                http,
            });
            tok_off[s] += cnt;
            step_idx[s] += 1;
        }
        if prov.is_empty() {
            break;
        }
        inputs.push(Input::Frame(sched.provenance(step, &prov)));
        inputs.push(Input::Frame(front.text(step, &text)));
        let flush = (step + 1).is_multiple_of(u64::from(cfg.coalesce.max(1)));
        for s in 0..n {
            let done = step_idx[s] == gens[s].steps.len();
            if (flush || done) && !sse_ids[s].is_empty() {
                if !chunk_sent[s] {
                    chunk_sent[s] = true;
                    inputs.push(Input::SseId {
                        stream: s as u16,
                        id: format!("chatcmpl-ph1_{}_{s}", crate::reconcile::run_id_hex(&run_id)),
                    });
                }
                inputs.push(Input::Sse {
                    stream: s as u16,
                    text: std::mem::take(&mut sse_text[s]),
                    token_ids: std::mem::take(&mut sse_ids[s]),
                });
                if done {
                    inputs.push(Input::FinishSse {
                        stream: s as u16,
                        reason: Some("length".to_owned()),
                    });
                }
            }
        }
        step += 1;
    }
    Workload {
        run_id,
        inputs,
        texts,
        total_tokens: u64::from(cfg.tokens_per_stream) * u64::from(cfg.streams),
    }
}

impl Workload {
    /// Feed every input to a reconciler.
    pub fn feed(&self, r: &mut crate::reconcile::Reconciler) {
        feed_inputs(&self.inputs, r);
    }

    /// The telemetry frames among the inputs, in order.
    pub fn frames(&self) -> Vec<&[u8]> {
        self.inputs
            .iter()
            .filter_map(|i| match i {
                Input::Frame(f) => Some(f.as_slice()),
                _ => None,
            })
            .collect()
    }
}

/// Feed inputs to a reconciler.
pub fn feed_inputs(inputs: &[Input], r: &mut crate::reconcile::Reconciler) {
    {
        for i in inputs {
            match i {
                Input::Frame(f) => r.push_frame(f),
                Input::Sse {
                    stream,
                    text,
                    token_ids,
                } => r.push_sse(*stream, text, token_ids),
                Input::SseId { stream, id } => r.push_sse_id(*stream, id),
                Input::FinishSse { stream, reason } => r.finish_sse(*stream, reason.as_deref()),
            }
        }
    }
}

/// Each delta of more than one character as two, cut at its middle
/// character, the first half with the first half of its token ids (none
/// for a one-token delta: text without ids).
pub fn split_deltas(inputs: Vec<Input>) -> Vec<Input> {
    inputs
        .into_iter()
        .flat_map(|input| match input {
            Input::Sse {
                stream,
                text,
                token_ids,
            } if text.chars().count() > 1 => {
                let cut = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
                let ids = token_ids.len() / 2;
                vec![
                    Input::Sse {
                        stream,
                        text: text[..cut].to_owned(),
                        token_ids: token_ids[..ids].to_vec(),
                    },
                    Input::Sse {
                        stream,
                        text: text[cut..].to_owned(),
                        token_ids: token_ids[ids..].to_vec(),
                    },
                ]
            }
            other => vec![other],
        })
        .collect()
}
