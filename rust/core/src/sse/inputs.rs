//! What one stream's SSE chunks say, as the reconciler's SSE inputs
//! (docs/PROTOCOL.md "Inputs"). This only extracts: every check of these
//! inputs against the other witnesses is a reconciler rule. The Python
//! reference of the same extraction is `parallelhue.reference.sse`.

use super::chunk::Chunk;
use super::error::SseError;
use super::scan::Scanned;

/// Which counters an [`SseInput::Counts`] carries (its `code` is the
/// recording's, its `name` the Python tuples').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountsKind {
    /// llama-server's cumulative `timings` of one chunk:
    /// `predicted_n`, `draft_n`, `draft_n_accepted` ([`super::chunk::TIMINGS_KEYS`]).
    Timings = 1,
    /// vLLM's `metrics.speculative_decoding` summary: `num_spec_steps`,
    /// `num_draft_tokens`, `num_accepted_draft_tokens` ([`super::chunk::SPEC_SUMMARY_KEYS`]).
    SpecSummary = 2,
}

impl CountsKind {
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<CountsKind> {
        match code {
            1 => Some(CountsKind::Timings),
            2 => Some(CountsKind::SpecSummary),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CountsKind::Timings => "timings",
            CountsKind::SpecSummary => "spec",
        }
    }

    pub fn from_name(name: &str) -> Option<CountsKind> {
        [CountsKind::Timings, CountsKind::SpecSummary]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

/// One SSE input of a stream, in the order the chunks said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseInput {
    /// Choice 0's text and token ids (`push_sse`).
    Delta { text: String, token_ids: Vec<u32> },
    /// The chunk id (`push_sse_id`); empty for a chunk without one.
    Id(String),
    /// A choice other than the single choice 0 (`push_sse_choice`).
    Choice(u32),
    /// `usage.completion_tokens` and vLLM's per-request metrics (`push_sse_usage`).
    Usage {
        completion_tokens: Option<u64>,
        per_step_accepted: Option<Vec<u32>>,
        per_step_drafted: Option<Vec<u32>>,
    },
    /// Step counters a stock server states (llama-server's `timings`,
    /// vLLM's summary counts): for the server-reported tier, which the
    /// client computes above the reconcilers; no reconciler reads them.
    Counts {
        kind: CountsKind,
        values: [Option<u64>; 3],
    },
    /// A telemetry frame the response carried in-band (`push_frame`).
    Frame(Vec<u8>),
    /// The response's in-band telemetry is missing frames (`push_stream_lost`).
    Lost(String),
}

impl SseInput {
    pub fn as_ref(&self) -> SseInputRef<'_> {
        match self {
            SseInput::Delta { text, token_ids } => SseInputRef::Delta { text, token_ids },
            SseInput::Id(id) => SseInputRef::Id(id),
            SseInput::Choice(index) => SseInputRef::Choice(*index),
            SseInput::Frame(frame) => SseInputRef::Frame(frame),
            SseInput::Lost(reason) => SseInputRef::Lost(reason),
            SseInput::Usage {
                completion_tokens,
                per_step_accepted,
                per_step_drafted,
            } => SseInputRef::Usage {
                completion_tokens: *completion_tokens,
                per_step_accepted: per_step_accepted.as_deref(),
                per_step_drafted: per_step_drafted.as_deref(),
            },
            SseInput::Counts { kind, values } => SseInputRef::Counts {
                kind: *kind,
                values: *values,
            },
        }
    }
}

/// [`SseInput`] borrowed from the chunk that says it: what the reader hands
/// on without copying (the reconciler and the screen copy what they keep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SseInputRef<'a> {
    Delta {
        text: &'a str,
        token_ids: &'a [u32],
    },
    Id(&'a str),
    Choice(u32),
    Usage {
        completion_tokens: Option<u64>,
        per_step_accepted: Option<&'a [u32]>,
        per_step_drafted: Option<&'a [u32]>,
    },
    Counts {
        kind: CountsKind,
        values: [Option<u64>; 3],
    },
    Frame(&'a [u8]),
    Lost(&'a str),
}

impl SseInputRef<'_> {
    pub fn to_owned(self) -> SseInput {
        match self {
            SseInputRef::Delta { text, token_ids } => SseInput::Delta {
                text: text.to_owned(),
                token_ids: token_ids.to_vec(),
            },
            SseInputRef::Id(id) => SseInput::Id(id.to_owned()),
            SseInputRef::Choice(index) => SseInput::Choice(index),
            SseInputRef::Frame(frame) => SseInput::Frame(frame.to_vec()),
            SseInputRef::Lost(reason) => SseInput::Lost(reason.to_owned()),
            SseInputRef::Usage {
                completion_tokens,
                per_step_accepted,
                per_step_drafted,
            } => SseInput::Usage {
                completion_tokens,
                per_step_accepted: per_step_accepted.map(<[u32]>::to_vec),
                per_step_drafted: per_step_drafted.map(<[u32]>::to_vec),
            },
            SseInputRef::Counts { kind, values } => SseInput::Counts { kind, values },
        }
    }
}

/// One choice as the extraction reads it, from an owned or a scanned chunk.
#[derive(Clone, Copy)]
struct ChoiceRef<'a> {
    index: u32,
    text: &'a str,
    token_ids: Option<&'a [u32]>,
    finish_reason: Option<&'a str>,
}

/// The extraction state of one stream.
#[derive(Clone, Debug, Default)]
pub struct ChunkInputs {
    /// The previous chunk's id (`""` without one); meaningless before the
    /// first chunk (`seen_chunk`). Kept for its capacity.
    last_id: String,
    seen_chunk: bool,
    choice_reported: bool,
    /// Choice 0's `finish_reason` once a chunk gave it (what `finish_sse`
    /// gets); a later chunk may repeat it, never change it.
    pub finish_reason: Option<String>,
    /// `usage.prompt_tokens` once a chunk gave it; never changes after.
    prompt_tokens: Option<u64>,
}

impl ChunkInputs {
    pub fn new() -> Self {
        Self::default()
    }

    /// The inputs of one chunk, in order: its id (first chunk, or a new id),
    /// a choice other than the single choice 0 (once per stream), choice 0's
    /// delta (when it has text or token ids), the usage (when the chunk has
    /// `usage` or `metrics.speculative_decoding`). What the stream already
    /// said stays said (evidence is monotone): a chunk whose choice 0 has
    /// text or token ids after an earlier chunk gave choice 0's finish_reason
    /// ([`SseError::ContentAfterFinish`]), another finish_reason
    /// ([`SseError::FinishReasonChanged`]) or another `usage.prompt_tokens`
    /// ([`SseError::PromptTokensChanged`]) is refused, before any of its inputs.
    pub fn extract(
        &mut self,
        chunk: Chunk,
        out: &mut impl FnMut(SseInput),
    ) -> Result<(), SseError> {
        self.extract_ref(&chunk, &mut |i| out(i.to_owned()))
    }

    /// [`ChunkInputs::extract`] with the inputs borrowed from `chunk`.
    pub fn extract_ref<'a>(
        &mut self,
        chunk: &'a Chunk,
        out: &mut impl FnMut(SseInputRef<'a>),
    ) -> Result<(), SseError> {
        let choices = chunk.choices.iter().map(|c| ChoiceRef {
            index: c.index,
            text: &c.text,
            token_ids: c.token_ids.as_deref(),
            finish_reason: c.finish_reason.as_deref(),
        });
        let prompt_tokens = chunk.usage.as_ref().and_then(|u| u.prompt_tokens);
        self.extract_choices(
            chunk.id.as_deref().unwrap_or_default(),
            choices,
            prompt_tokens,
            out,
        )?;
        if chunk.usage.is_some() || chunk.spec_steps.is_some() {
            let steps = chunk.spec_steps.as_ref();
            out(SseInputRef::Usage {
                completion_tokens: chunk.usage.as_ref().and_then(|u| u.completion_tokens),
                per_step_accepted: steps.and_then(|s| s.per_step_accepted.as_deref()),
                per_step_drafted: steps.and_then(|s| s.per_step_drafted.as_deref()),
            });
        }
        let summary = chunk.spec_steps.as_ref().map(|s| s.summary);
        for (kind, values) in [
            (CountsKind::SpecSummary, summary),
            (CountsKind::Timings, chunk.timings.as_deref().copied()),
        ] {
            if let Some(values) = values.filter(|v| v.iter().any(Option::is_some)) {
                out(SseInputRef::Counts { kind, values });
            }
        }
        Ok(())
    }

    /// [`ChunkInputs::extract_ref`] for a chunk the scanner read (which has
    /// no usage: the scanner leaves those to the slower paths).
    pub fn extract_scanned<'a>(
        &mut self,
        data: &'a str,
        chunk: &'a Scanned,
        out: &mut impl FnMut(SseInputRef<'a>),
    ) -> Result<(), SseError> {
        let choices = chunk.choices.iter().map(|c| ChoiceRef {
            index: c.index,
            text: &data[c.text.clone()],
            token_ids: c.token_ids.clone().map(|r| &chunk.ids[r]),
            finish_reason: c.finish_reason.clone().map(|r| &data[r]),
        });
        let id = chunk.id.clone().map_or("", |r| &data[r]);
        self.extract_choices(id, choices, None, out)
    }

    /// The id, other-choice and delta inputs of a chunk (whose usage, if
    /// any, says `prompt_tokens`).
    fn extract_choices<'a>(
        &mut self,
        id: &'a str,
        choices: impl Iterator<Item = ChoiceRef<'a>> + Clone,
        prompt_tokens: Option<u64>,
        out: &mut impl FnMut(SseInputRef<'a>),
    ) -> Result<(), SseError> {
        if let (Some(before), Some(c)) =
            (&self.finish_reason, choices.clone().find(|c| c.index == 0))
        {
            if !c.text.is_empty() || c.token_ids.is_some_and(|t| !t.is_empty()) {
                return Err(SseError::ContentAfterFinish);
            }
            if let Some(now) = c.finish_reason.filter(|&now| now != before) {
                return Err(SseError::FinishReasonChanged {
                    before: before.clone(),
                    now: now.to_owned(),
                });
            }
        }
        match (self.prompt_tokens, prompt_tokens) {
            (Some(before), Some(now)) if now != before => {
                return Err(SseError::PromptTokensChanged { before, now })
            }
            (None, now) => self.prompt_tokens = now,
            _ => {}
        }
        if !self.seen_chunk || self.last_id != id {
            out(SseInputRef::Id(id));
            self.seen_chunk = true;
            self.last_id.clear();
            self.last_id.push_str(id);
        }
        let mut zero: Option<ChoiceRef<'a>> = None;
        let mut other: Option<u32> = None;
        for choice in choices {
            if choice.index == 0 && zero.is_none() {
                zero = Some(choice);
            } else if other.is_none() {
                other = Some(choice.index);
            }
        }
        if let Some(index) = other {
            if !self.choice_reported {
                self.choice_reported = true;
                out(SseInputRef::Choice(index));
            }
        }
        if let Some(choice) = zero {
            let token_ids = choice.token_ids.unwrap_or_default();
            if !choice.text.is_empty() || !token_ids.is_empty() {
                out(SseInputRef::Delta {
                    text: choice.text,
                    token_ids,
                });
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::parse_chunk;

    fn inputs(chunks: &[&str]) -> (Vec<SseInput>, Option<String>) {
        let mut x = ChunkInputs::new();
        let mut out = Vec::new();
        for c in chunks {
            x.extract(parse_chunk(c).unwrap(), &mut |i| out.push(i))
                .unwrap();
        }
        (out, x.finish_reason)
    }

    fn delta(text: &str, ids: &[u32]) -> SseInput {
        SseInput::Delta {
            text: text.into(),
            token_ids: ids.to_vec(),
        }
    }

    #[test]
    fn id_once_then_on_change_deltas_and_finish_reason() {
        let (out, finish) = inputs(&[
            r#"{"id":"a","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[1]}]}"#,
            r#"{"id":"b","choices":[{"index":0,"text":"y","finish_reason":null}]}"#,
            r#"{"id":"b","choices":[{"index":0,"delta":{"content":""},"token_ids":[],"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"completion_tokens":2},"metrics":{"speculative_decoding":{"per_step_accepted":[1],"per_step_drafted":[3]}}}"#,
        ]);
        assert_eq!(
            out,
            vec![
                SseInput::Id("a".into()),
                delta("x", &[1]),
                SseInput::Id("b".into()),
                delta("y", &[]),
                SseInput::Id(String::new()),
                SseInput::Usage {
                    completion_tokens: Some(2),
                    per_step_accepted: Some(vec![1]),
                    per_step_drafted: Some(vec![3]),
                },
            ]
        );
        assert_eq!(finish.as_deref(), Some("stop"));
    }

    #[test]
    fn step_counts_follow_the_usage_and_the_delta_of_their_chunk() {
        let (out, _) = inputs(&[
            r#"{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"timings":{"predicted_n":3,"predicted_ms":1.5,"draft_n":4,"draft_n_accepted":2}}"#,
            r#"{"id":"c","choices":[],"timings":{"predicted_ms":2.0}}"#,
            r#"{"id":"c","choices":[],"usage":{"completion_tokens":3},"metrics":{"speculative_decoding":{"per_step_accepted":[2],"per_step_drafted":[4],"num_spec_steps":1,"num_draft_tokens":4,"num_accepted_draft_tokens":2}},"timings":{"predicted_n":3}}"#,
        ]);
        assert_eq!(
            out,
            vec![
                SseInput::Id("c".into()),
                delta("x", &[]),
                SseInput::Counts {
                    kind: CountsKind::Timings,
                    values: [Some(3), Some(4), Some(2)],
                },
                SseInput::Usage {
                    completion_tokens: Some(3),
                    per_step_accepted: Some(vec![2]),
                    per_step_drafted: Some(vec![4]),
                },
                SseInput::Counts {
                    kind: CountsKind::SpecSummary,
                    values: [Some(1), Some(4), Some(2)],
                },
                SseInput::Counts {
                    kind: CountsKind::Timings,
                    values: [Some(3), None, None],
                },
            ]
        );
    }

    #[test]
    fn other_choices_are_reported_once_and_never_mixed_into_choice_0() {
        let (out, finish) = inputs(&[
            r#"{"id":"a","choices":[{"index":1,"text":"no","finish_reason":"length"},{"index":0,"text":"x"}]}"#,
            r#"{"id":"a","choices":[{"index":0,"text":"y"},{"index":0,"text":"z"}]}"#,
        ]);
        assert_eq!(
            out,
            vec![
                SseInput::Id("a".into()),
                SseInput::Choice(1),
                delta("x", &[]),
                delta("y", &[]),
            ]
        );
        assert_eq!(finish, None);
    }

    #[test]
    fn content_after_choice_0_finished_is_refused() {
        let mut x = ChunkInputs::new();
        let mut out = Vec::new();
        let mut push =
            |x: &mut ChunkInputs, c: &str| x.extract(parse_chunk(c).unwrap(), &mut |i| out.push(i));
        let finish = r#"{"id":"a","choices":[{"index":0,"delta":{"content":"x"},"token_ids":[1],"finish_reason":"length"}]}"#;
        assert_eq!(push(&mut x, finish), Ok(()));
        // Nothing for choice 0, or choice 0 without content: fine.
        assert_eq!(
            push(
                &mut x,
                r#"{"id":"a","choices":[{"index":0,"delta":{}}],"usage":null}"#
            ),
            Ok(())
        );
        let more = r#"{"id":"a","choices":[{"index":0,"delta":{"content":""},"token_ids":[2]}]}"#;
        let err = push(&mut x, more).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid SSE chunk: choice 0 has content after its finish_reason"
        );
    }

    /// What a stream said stays said: a chunk may repeat choice 0's
    /// finish_reason and usage.prompt_tokens, never change them.
    #[test]
    fn a_changed_finish_reason_or_prompt_count_is_refused() {
        let refused = |chunks: &[&str]| {
            let mut x = ChunkInputs::new();
            let mut out = Vec::new();
            let mut result = Ok(());
            for c in chunks {
                result = x.extract(parse_chunk(c).unwrap(), &mut |i| out.push(i));
                if result.is_err() {
                    break;
                }
            }
            result.map_err(|e| e.to_string())
        };
        let finish = |r: &str| {
            format!(r#"{{"id":"a","choices":[{{"index":0,"text":"","finish_reason":"{r}"}}]}}"#)
        };
        let usage = |n: u64| {
            format!(
                r#"{{"id":"a","choices":[],"usage":{{"prompt_tokens":{n},"completion_tokens":1}}}}"#
            )
        };
        assert_eq!(
            refused(&[&finish("stop"), &finish("stop"), &usage(4), &usage(4)]),
            Ok(())
        );
        assert_eq!(
            refused(&[&finish("length"), &finish("stop")]),
            Err("invalid SSE chunk: choice 0's finish_reason 'stop' after 'length'".into())
        );
        assert_eq!(
            refused(&[&usage(4), &finish("stop"), &usage(5)]),
            Err("invalid SSE chunk: usage.prompt_tokens 5 after 4".into())
        );
    }

    /// The scanner's borrowed chunk gives the inputs, finish reason and
    /// refusal the owned chunk of the `Value` path gives, chunk by chunk.
    #[test]
    fn scanned_chunks_give_the_inputs_of_the_value_path() {
        let chunks = [
            r#"{"id":"a","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"id":"a","choices":[{"index":0,"delta":{"content":"hé"},"token_ids":[5,6]}]}"#,
            r#"{"id":"b","choices":[{"index":0,"delta":{"content":"x","token_ids":[7]}}]}"#,
            r#"{"choices":[{"index":2,"text":"no"},{"index":0,"text":"y","token_ids":null}]}"#,
            r#"{"id":"b","choices":[{"index":0,"text":"","token_ids":[],"finish_reason":"stop"}],"usage":null}"#,
            r#"{"id":"b","choices":[{"index":0,"delta":{"content":""}}]}"#,
            r#"{"id":"b","choices":[{"index":0,"delta":{"content":"late"}}]}"#,
        ];
        let mut scanned = Scanned::default();
        let (mut a, mut b) = (ChunkInputs::new(), ChunkInputs::new());
        let mut refused = 0;
        for data in chunks {
            assert!(crate::sse::scan::scan_into(data, &mut scanned), "{data}");
            let mut from_scan = Vec::new();
            let ra = a.extract_scanned(data, &scanned, &mut |i| from_scan.push(i.to_owned()));
            let mut from_value = Vec::new();
            let chunk = crate::sse::parse_chunk_value(data).unwrap();
            let rb = b.extract(chunk, &mut |i| from_value.push(i));
            assert_eq!(ra, rb, "{data}");
            assert_eq!(from_scan, from_value, "{data}");
            assert_eq!(a.finish_reason, b.finish_reason, "{data}");
            refused += usize::from(ra.is_err());
        }
        // The last chunk is content after the finish reason.
        assert_eq!(refused, 1);
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
        assert_eq!(
            b.finish_reason.as_deref(),
            Some("stop"),
            "the value path saw the same finish"
        );
    }
}
