//! What an OpenAI chat/completions streaming chunk is, as the three chunk
//! readers (`scan`, `typed`, `value`) give it, and the one rule for which of
//! a choice's fields count.

/// One choice of a streaming chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choice {
    pub index: u32,
    /// `delta.content` (chat) or `text` (completions); empty when absent or null.
    pub text: String,
    /// `token_ids` of the choice (or of its delta); None when absent or null.
    pub token_ids: Option<Vec<u32>>,
    pub finish_reason: Option<String>,
}

/// Token usage, when the chunk carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub total_tokens: Option<u64>,
}

/// vLLM's per-request speculative-decoding metrics of the final usage chunk
/// (`metrics.speculative_decoding`, `--per-request-spec-decode-metrics
/// detailed`): accepted and drafted counts per verify step, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecSteps {
    pub per_step_accepted: Option<Vec<u32>>,
    pub per_step_drafted: Option<Vec<u32>>,
    /// The summary counts beside the lists, [`SPEC_SUMMARY_KEYS`] in order:
    /// read for the server-reported tier only (no reconciler rule reads them).
    pub summary: [Option<u64>; 3],
}

/// vLLM's summary counts of `metrics.speculative_decoding`, in [`SpecSteps::summary`]'s order.
pub const SPEC_SUMMARY_KEYS: [&str; 3] = [
    "num_spec_steps",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
];

/// llama-server's cumulative counters of a chunk's `timings` (with
/// `timings_per_token`), in [`Chunk::timings`]' order.
pub const TIMINGS_KEYS: [&str; 3] = ["predicted_n", "draft_n", "draft_n_accepted"];

/// A chat/completions streaming chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    pub id: Option<String>,
    pub choices: Vec<Choice>,
    pub usage: Option<Usage>,
    /// Present when the chunk has `metrics.speculative_decoding`.
    pub spec_steps: Option<SpecSteps>,
    /// llama-server's `timings` counters ([`TIMINGS_KEYS`]), when the chunk
    /// has a `timings` object: for the server-reported tier only (boxed: most
    /// chunks have none, and a chunk stays small).
    pub timings: Option<Box<[Option<u64>; 3]>>,
}

/// A parsed event of an OpenAI stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseEvent {
    Chunk(Chunk),
    /// `data: [DONE]`.
    Done,
    /// An event with a non-default `event:` type, passed through.
    Other {
        event: String,
        data: String,
    },
}

/// A choice's text and token ids as a reader found them, before the one rule
/// of which of them count (all three readers resolve through it): with a
/// delta (present and not null), the text is the delta's `content`, else the
/// choice's own `text`; the choice's own `token_ids`, when the key is there
/// (even null), win over the delta's.
pub(crate) struct FoundChoice<T, I> {
    /// The choice's delta, when present and not null.
    pub delta: Option<FoundDelta<T, I>>,
    /// The choice's own `text` (None: absent or null).
    pub text: Option<T>,
    /// The choice's own `token_ids`: None when the key is absent, Some(None) when null.
    pub token_ids: Option<Option<I>>,
}

/// A chat delta's fields that count (each None: absent or null).
pub(crate) struct FoundDelta<T, I> {
    pub content: Option<T>,
    pub token_ids: Option<I>,
}

impl<T, I: Clone> FoundChoice<T, I> {
    /// (text, token ids) by the rule; None: absent or null.
    #[inline(always)]
    pub(crate) fn resolve(self) -> (Option<T>, Option<I>) {
        let token_ids = match self.token_ids {
            Some(ids) => ids,
            None => self.delta.as_ref().and_then(|d| d.token_ids.clone()),
        };
        let text = match self.delta {
            Some(d) => d.content,
            None => self.text,
        };
        (text, token_ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::parse_chunk_value;

    fn resolve(
        delta: Option<FoundDelta<&'static str, u8>>,
        text: Option<&'static str>,
        token_ids: Option<Option<u8>>,
    ) -> (Option<&'static str>, Option<u8>) {
        FoundChoice {
            delta,
            text,
            token_ids,
        }
        .resolve()
    }

    #[test]
    fn a_delta_gives_the_text_and_the_choices_own_ids_win() {
        // A delta's content, even absent, is the text; the choice's own is not read.
        assert_eq!(
            resolve(
                Some(FoundDelta {
                    content: Some("d"),
                    token_ids: None
                }),
                Some("t"),
                None
            ),
            (Some("d"), None)
        );
        assert_eq!(
            resolve(
                Some(FoundDelta {
                    content: None,
                    token_ids: None
                }),
                Some("t"),
                None
            ),
            (None, None)
        );
        assert_eq!(resolve(None, Some("t"), None), (Some("t"), None));
        // The choice's own ids when the key is there, even null; else the delta's.
        assert_eq!(
            resolve(
                Some(FoundDelta {
                    content: None,
                    token_ids: Some(2)
                }),
                None,
                Some(Some(1))
            ),
            (None, Some(1))
        );
        assert_eq!(
            resolve(
                Some(FoundDelta {
                    content: None,
                    token_ids: Some(2)
                }),
                None,
                Some(None)
            ),
            (None, None)
        );
        assert_eq!(
            resolve(
                Some(FoundDelta {
                    content: None,
                    token_ids: Some(2)
                }),
                None,
                None
            ),
            (None, Some(2))
        );
        assert_eq!(resolve(None, None, None), (None, None));
    }

    #[test]
    fn the_value_reader_checks_only_the_fields_the_rule_picks() {
        // With a delta, a choice's `text` of the wrong type is not read; with
        // its own `token_ids` (null), the delta's wrong ones are not either.
        let chunk = r#"{"choices":[{"index":0,"delta":{"content":"x","token_ids":"no"},"text":1,"token_ids":null}]}"#;
        let c = parse_chunk_value(chunk).unwrap();
        assert_eq!(
            (c.choices[0].text.as_str(), &c.choices[0].token_ids),
            ("x", &None)
        );
        // What it picks is checked, with the path it came from.
        let chunk = r#"{"choices":[{"index":0,"delta":{"token_ids":"no"}}]}"#;
        assert_eq!(
            parse_chunk_value(chunk).unwrap_err().to_string(),
            "invalid SSE chunk: choices[0].delta.token_ids must be an array of integers or null"
        );
        let chunk = r#"{"choices":[{"index":0,"text":7}]}"#;
        assert_eq!(
            parse_chunk_value(chunk).unwrap_err().to_string(),
            "invalid SSE chunk: choices[0].text must be a string or null"
        );
    }
}
