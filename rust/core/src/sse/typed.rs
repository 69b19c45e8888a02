//! The fast path of [`super::parse_chunk`]: a chunk's few fields
//! deserialized straight from the JSON text, with no `serde_json::Value`
//! tree (the client's SSE thread parses one chunk per stream per engine
//! step). Unknown fields are skipped without allocating.
//!
//! It answers only for a chunk whose answer is unambiguous; on anything
//! else — an `error` key or `object: "error"`, a duplicate key among the
//! fields read, a field of another type than expected, a missing `choices`
//! or `index`, invalid JSON — it gives up and the `Value` path decides, with
//! its exact error messages. Where this path answers, every check of the
//! `Value` path holds (each field read is typed as strictly as it checks
//! it), so both agree by construction.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::chunk::{
    Choice, Chunk, FoundChoice, FoundDelta, SpecSteps, Usage, SPEC_SUMMARY_KEYS, TIMINGS_KEYS,
};

/// The chunk, or None when the `Value` path must decide.
pub(crate) fn parse_chunk_typed(data: &str) -> Option<Chunk> {
    serde_json::from_str::<TypedChunk>(data).ok().map(|c| c.0)
}

fn give_up<E: de::Error>() -> E {
    E::custom("not a plain chunk")
}

/// Store a field's value, giving up on a second occurrence (the `Value`
/// path keeps the last one; which one wins is not this path's business).
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(give_up());
    }
    *slot = Some(value);
    Ok(())
}

/// A value that is only skipped. Parsed through `deserialize_any` (not
/// `IgnoredAny`, which serde_json skips without its nesting limit), so a
/// document the `Value` path refuses as too deep is refused here too.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

/// An object key among `names` (its position), or None for another key.
/// Keys are compared after unescaping, as the `Value` path does.
struct Key<const N: usize>(Option<usize>);

struct KeyVisitor<const N: usize>(&'static [&'static str; N]);

impl<'de, const N: usize> Visitor<'de> for KeyVisitor<N> {
    type Value = Key<N>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Key<N>, E> {
        Ok(Key(self.0.iter().position(|n| *n == v)))
    }
}

fn next_key<'de, A: MapAccess<'de>, const N: usize>(
    map: &mut A,
    names: &'static [&'static str; N],
) -> Result<Option<Option<usize>>, A::Error> {
    struct Seed<const N: usize>(&'static [&'static str; N]);
    impl<'de, const N: usize> de::DeserializeSeed<'de> for Seed<N> {
        type Value = Key<N>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<N>, D::Error> {
            d.deserialize_str(KeyVisitor(self.0))
        }
    }
    Ok(map.next_key_seed(Seed(names))?.map(|k| k.0))
}

/// An object, decoded by `visit` field by field.
macro_rules! object_visitor {
    ($name:ident, $value:ty, $what:literal, |$map:ident| $body:block) => {
        struct $name;
        impl<'de> Visitor<'de> for $name {
            type Value = $value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($what)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut $map: A) -> Result<$value, A::Error> {
                $body
            }
        }
        impl<'de> Deserialize<'de> for Wrap<$value> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_map($name).map(Wrap)
            }
        }
    };
}

/// A typed value (the wrapper gives the crate's own types a `Deserialize`).
struct Wrap<T>(T);

type TypedChunk = Wrap<Chunk>;

/// `"error"` or another string (a non-string `object` is left to the `Value` path).
struct IsError(bool);

impl<'de> Deserialize<'de> for IsError {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IsError;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, v: &str) -> Result<IsError, E> {
                Ok(IsError(v == "error"))
            }
        }
        d.deserialize_str(V)
    }
}

const CHUNK_KEYS: [&str; 7] = [
    "id", "object", "error", "choices", "usage", "metrics", "timings",
];

object_visitor!(ChunkVisitor, Chunk, "a chunk object", |map| {
    let mut id: Option<Option<String>> = None;
    let mut object: Option<()> = None;
    let mut choices: Option<Vec<Choice>> = None;
    let mut usage: Option<Option<Usage>> = None;
    let mut metrics: Option<Option<SpecSteps>> = None;
    let mut timings: Option<Option<[Option<u64>; 3]>> = None;
    while let Some(key) = next_key(&mut map, &CHUNK_KEYS)? {
        match key {
            Some(0) => once(&mut id, map.next_value::<Option<String>>()?)?,
            Some(1) => {
                if map.next_value::<IsError>()?.0 {
                    return Err(give_up());
                }
                once(&mut object, ())?;
            }
            Some(2) => return Err(give_up()),
            Some(3) => {
                let list = map.next_value::<Vec<Wrap<Choice>>>()?;
                once(&mut choices, list.into_iter().map(|c| c.0).collect())?;
            }
            Some(4) => once(
                &mut usage,
                map.next_value::<Option<Wrap<Usage>>>()?.map(|u| u.0),
            )?,
            Some(5) => once(
                &mut metrics,
                map.next_value::<Option<Wrap<Metrics>>>()?
                    .and_then(|m| m.0 .0),
            )?,
            Some(6) => once(
                &mut timings,
                map.next_value::<Option<Wrap<Timings>>>()?.map(|t| t.0 .0),
            )?,
            _ => {
                map.next_value::<Skip>()?;
            }
        }
    }
    Ok(Chunk {
        id: id.flatten(),
        choices: choices.ok_or_else(give_up)?,
        usage: usage.flatten(),
        spec_steps: metrics.flatten(),
        timings: timings.flatten().map(Box::new),
    })
});

const CHOICE_KEYS: [&str; 5] = ["index", "delta", "text", "token_ids", "finish_reason"];

object_visitor!(ChoiceVisitor, Choice, "a choice object", |map| {
    let mut index: Option<u32> = None;
    let mut delta: Option<Option<Delta>> = None;
    let mut text: Option<Option<String>> = None;
    let mut token_ids: Option<Option<Vec<u32>>> = None;
    let mut finish_reason: Option<Option<String>> = None;
    while let Some(key) = next_key(&mut map, &CHOICE_KEYS)? {
        match key {
            Some(0) => once(&mut index, map.next_value::<u32>()?)?,
            Some(1) => once(
                &mut delta,
                map.next_value::<Option<Wrap<Delta>>>()?.map(|d| d.0),
            )?,
            Some(2) => once(&mut text, map.next_value::<Option<String>>()?)?,
            Some(3) => once(&mut token_ids, map.next_value::<Option<Vec<u32>>>()?)?,
            Some(4) => once(&mut finish_reason, map.next_value::<Option<String>>()?)?,
            _ => {
                map.next_value::<Skip>()?;
            }
        }
    }
    let (text, token_ids) = FoundChoice {
        delta: delta.flatten(),
        text: text.flatten(),
        token_ids,
    }
    .resolve();
    Ok(Choice {
        index: index.ok_or_else(give_up)?,
        text: text.unwrap_or_default(),
        token_ids,
        finish_reason: finish_reason.flatten(),
    })
});

/// A chat delta's fields that count.
type Delta = FoundDelta<String, Vec<u32>>;

const DELTA_KEYS: [&str; 2] = ["content", "token_ids"];

object_visitor!(DeltaVisitor, Delta, "a delta object", |map| {
    let mut content: Option<Option<String>> = None;
    let mut token_ids: Option<Option<Vec<u32>>> = None;
    while let Some(key) = next_key(&mut map, &DELTA_KEYS)? {
        match key {
            Some(0) => once(&mut content, map.next_value::<Option<String>>()?)?,
            Some(1) => once(&mut token_ids, map.next_value::<Option<Vec<u32>>>()?)?,
            _ => {
                map.next_value::<Skip>()?;
            }
        }
    }
    Ok(Delta {
        content: content.flatten(),
        token_ids: token_ids.flatten(),
    })
});

const USAGE_KEYS: [&str; 3] = ["prompt_tokens", "completion_tokens", "total_tokens"];

object_visitor!(UsageVisitor, Usage, "a usage object", |map| {
    let mut counts: [Option<Option<u64>>; 3] = [None; 3];
    while let Some(key) = next_key(&mut map, &USAGE_KEYS)? {
        match key {
            Some(k) => once(&mut counts[k], map.next_value::<Option<u64>>()?)?,
            None => {
                map.next_value::<Skip>()?;
            }
        }
    }
    let [prompt_tokens, completion_tokens, total_tokens] = counts.map(Option::flatten);
    Ok(Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens,
    })
});

/// `metrics`: its `speculative_decoding`, if present and not null.
struct Metrics(Option<SpecSteps>);

const METRICS_KEYS: [&str; 1] = ["speculative_decoding"];

object_visitor!(MetricsVisitor, Metrics, "a metrics object", |map| {
    let mut spec: Option<Option<SpecSteps>> = None;
    while let Some(key) = next_key(&mut map, &METRICS_KEYS)? {
        match key {
            Some(_) => once(
                &mut spec,
                map.next_value::<Option<Wrap<SpecSteps>>>()?.map(|s| s.0),
            )?,
            None => {
                map.next_value::<Skip>()?;
            }
        }
    }
    Ok(Metrics(spec.flatten()))
});

const SPEC_KEYS: [&str; 5] = [
    "per_step_accepted",
    "per_step_drafted",
    SPEC_SUMMARY_KEYS[0],
    SPEC_SUMMARY_KEYS[1],
    SPEC_SUMMARY_KEYS[2],
];

object_visitor!(
    SpecVisitor,
    SpecSteps,
    "a speculative_decoding object",
    |map| {
        let mut lists: [Option<Option<Vec<u32>>>; 2] = [None, None];
        let mut summary: [Option<Option<u64>>; 3] = [None; 3];
        while let Some(key) = next_key(&mut map, &SPEC_KEYS)? {
            match key {
                Some(k @ 0..=1) => once(&mut lists[k], map.next_value::<Option<Vec<u32>>>()?)?,
                Some(k) => once(&mut summary[k - 2], map.next_value::<Option<u64>>()?)?,
                None => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        let [per_step_accepted, per_step_drafted] = lists.map(Option::flatten);
        Ok(SpecSteps {
            per_step_accepted,
            per_step_drafted,
            summary: summary.map(Option::flatten),
        })
    }
);

/// llama-server's `timings` ([`TIMINGS_KEYS`]; its other fields are skipped).
struct Timings([Option<u64>; 3]);

object_visitor!(TimingsVisitor, Timings, "a timings object", |map| {
    let mut counts: [Option<Option<u64>>; 3] = [None; 3];
    while let Some(key) = next_key(&mut map, &TIMINGS_KEYS)? {
        match key {
            Some(k) => once(&mut counts[k], map.next_value::<Option<u64>>()?)?,
            None => {
                map.next_value::<Skip>()?;
            }
        }
    }
    Ok(Timings(counts.map(Option::flatten)))
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::parse_chunk_value;

    /// Both paths on one payload: the typed path answers `typed` (Some or
    /// None), and `parse_chunk` equals the `Value` path, result or error.
    fn agree(data: &str, typed_answers: bool) -> Result<Chunk, String> {
        let typed = parse_chunk_typed(data);
        assert_eq!(typed.is_some(), typed_answers, "typed path on {data}");
        let value = parse_chunk_value(data).map_err(|e| e.to_string());
        if let Some(chunk) = &typed {
            assert_eq!(Ok(chunk), value.as_ref(), "{data}");
        }
        // The byte scanner in front of both answers only as they do.
        if let Some(chunk) = crate::sse::scan::scan_chunk(data) {
            assert_eq!(Ok(&chunk), value.as_ref(), "scanned: {data}");
        }
        assert_eq!(
            crate::sse::parse_chunk(data).map_err(|e| e.to_string()),
            value,
            "{data}"
        );
        value
    }

    fn choice0(data: &str) -> Choice {
        agree(data, true).unwrap().choices.remove(0)
    }

    #[test]
    fn plain_chat_and_completions_chunks_take_the_typed_path() {
        let c = agree(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"h\u00e9","reasoning_content":null,"tool_calls":[{"a":[1,{"b":null}]}]},"logprobs":{"content":[{"token":"x","logprob":-0.5,"bytes":[104]}]},"finish_reason":null,"token_ids":[5,6]}],"usage":null}"#,
            true,
        )
        .unwrap();
        assert_eq!(c.id.as_deref(), Some("chatcmpl-1"));
        assert_eq!(c.choices[0].text, "h\u{e9}");
        assert_eq!(c.choices[0].token_ids, Some(vec![5, 6]));
        assert_eq!(c.usage, None);
        let c = choice0(
            r#"{"choices":[{"index":0,"text":"x","token_ids":null,"finish_reason":"stop"}]}"#,
        );
        assert_eq!(
            (c.text.as_str(), c.token_ids, c.finish_reason.as_deref()),
            ("x", None, Some("stop"))
        );
        let c = agree(
            r#"{"id":null,"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":{"cached_tokens":0}},"metrics":{"speculative_decoding":{"per_step_accepted":[1,0],"per_step_drafted":[2,2],"other":1.5},"x":[]}}"#,
            true,
        )
        .unwrap();
        assert_eq!(c.id, None);
        assert_eq!(c.usage.unwrap().completion_tokens, Some(1));
        let spec = c.spec_steps.unwrap();
        assert_eq!(spec.per_step_accepted, Some(vec![1, 0]));
        assert_eq!(spec.per_step_drafted, Some(vec![2, 2]));
        // metrics without speculative_decoding, or null: no spec steps.
        assert_eq!(
            agree(r#"{"choices":[],"metrics":{"a":1}}"#, true)
                .unwrap()
                .spec_steps,
            None
        );
        assert_eq!(
            agree(r#"{"choices":[],"metrics":null}"#, true)
                .unwrap()
                .spec_steps,
            None
        );
    }

    #[test]
    fn step_counters_of_stock_servers_take_the_typed_path() {
        // llama-server's per-token chunk with `timings_per_token` (other timing fields skipped).
        let c = agree(
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"created":1,"id":"chatcmpl-x","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk","timings":{"cache_n":0,"prompt_n":4,"prompt_ms":1.5,"predicted_n":7,"predicted_ms":9.25,"predicted_per_second":700.1,"draft_n":9,"draft_n_accepted":5}}"#,
            true,
        )
        .unwrap();
        assert_eq!(c.timings.as_deref(), Some(&[Some(7), Some(9), Some(5)]));
        assert_eq!(
            agree(r#"{"choices":[],"timings":{"predicted_n":1}}"#, true)
                .unwrap()
                .timings
                .as_deref(),
            Some(&[Some(1), None, None])
        );
        assert_eq!(
            agree(r#"{"choices":[],"timings":null}"#, true)
                .unwrap()
                .timings,
            None
        );
        // vLLM's summary counts beside the lists.
        let spec = agree(
            r#"{"choices":[],"metrics":{"speculative_decoding":{"num_spec_steps":2,"num_draft_tokens":6,"num_accepted_draft_tokens":3,"per_step_accepted":[1,2],"per_step_drafted":[3,3],"acceptance_histogram":[0,1,1,0]}}}"#,
            true,
        )
        .unwrap()
        .spec_steps
        .unwrap();
        assert_eq!(spec.summary, [Some(2), Some(6), Some(3)]);
    }

    #[test]
    fn escaped_strings_and_keys_decode_alike() {
        let c = choice0(
            r#"{"choices":[{"index":0,"delta":{"content":"a\"b\\c\/d\n\t\u00e9\u4e16\ud83d\ude00"}}]}"#,
        );
        assert_eq!(c.text, "a\"b\\c/d\n\t\u{e9}\u{4e16}\u{1f600}");
        // An escaped key is the same key.
        let c =
            choice0(r#"{"choices":[{"\u0069ndex":0,"delta":{"cont\u0065nt":"x"}}],"\u0069d":"q"}"#);
        assert_eq!(c.text, "x");
        assert_eq!(
            agree(r#"{"choices":[],"\u0069d":"q"}"#, true)
                .unwrap()
                .id
                .as_deref(),
            Some("q")
        );
    }

    #[test]
    fn lone_surrogates_and_bad_json_are_the_value_paths_errors() {
        for data in [
            r#"{"choices":[{"index":0,"delta":{"content":"\ud800"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"\udc00x"}}]}"#,
            r#"{"choices":[],"skipped":"\ud800"}"#,
            r#"{"choices":[{"index":0}]} x"#,
            r#"{"choices":[{"index":0,}]}"#,
            r#"{"choices":[],"n":1e400}"#,
            r#"[1]"#,
            r#""text""#,
        ] {
            let err = agree(data, false).unwrap_err();
            assert!(
                err.starts_with("invalid JSON in SSE data: ") || err.contains("must be"),
                "{err}"
            );
        }
        assert_eq!(
            agree(
                r#"{"choices":[{"index":0,"delta":{"content":"\ud800"}}]}"#,
                false
            ),
            Err(
                "invalid JSON in SSE data: unexpected end of hex escape at line 1 column 50".into()
            )
        );
        assert_eq!(
            agree("[1]", false),
            Err("invalid SSE chunk: the data must be a JSON object".into())
        );
    }

    #[test]
    fn non_integer_token_ids_and_indexes_are_the_value_paths_errors() {
        let cases = [
            (r#"{"choices":[{"index":0,"token_ids":[1,2.0]}]}"#, "choices[0].token_ids[1] must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"index":0,"token_ids":[1,-2]}]}"#, "choices[0].token_ids[1] must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"index":0,"token_ids":[4294967296]}]}"#, "choices[0].token_ids[0] must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"index":0,"token_ids":["1"]}]}"#, "choices[0].token_ids[0] must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"index":0,"delta":{"token_ids":[null]}}]}"#, "choices[0].delta.token_ids[0] must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"index":0,"token_ids":7}]}"#, "choices[0].token_ids must be an array of integers or null"),
            (r#"{"choices":[{"index":0.0}]}"#, "choices[0].index must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"index":-1}]}"#, "choices[0].index must be an integer in 0..=4294967295"),
            (r#"{"choices":[{"delta":{}}]}"#, "choices[0].index must be present"),
            (r#"{"choices":[{"index":0,"delta":"x"}]}"#, "choices[0].delta must be an object"),
            (r#"{"choices":[{"index":0,"delta":{"content":1}}]}"#, "choices[0].delta.content must be a string or null"),
            (r#"{"choices":[{"index":0,"finish_reason":1}]}"#, "choices[0].finish_reason must be a string or null"),
            (r#"{"choices":null}"#, "choices must be an array"),
            (r#"{"id":"x"}"#, "choices must be present"),
            (r#"{"id":1,"choices":[]}"#, "id must be a string or null"),
            (r#"{"choices":[],"usage":{"completion_tokens":1.5}}"#, "usage.completion_tokens must be a non-negative integer"),
            (r#"{"choices":[],"usage":[]}"#, "usage must be an object or null"),
            (r#"{"choices":[],"metrics":{"speculative_decoding":{"per_step_drafted":[-1]}}}"#, "metrics.speculative_decoding.per_step_drafted[0] must be an integer in 0..=4294967295"),
            (r#"{"choices":[],"metrics":{"speculative_decoding":{"num_spec_steps":-1}}}"#, "metrics.speculative_decoding.num_spec_steps must be a non-negative integer"),
            (r#"{"choices":[],"timings":{"predicted_n":2.5}}"#, "timings.predicted_n must be a non-negative integer"),
            (r#"{"choices":[],"timings":{"draft_n":"3"}}"#, "timings.draft_n must be a non-negative integer"),
            (r#"{"choices":[],"timings":[]}"#, "timings must be an object or null"),
        ];
        for (data, message) in cases {
            assert_eq!(
                agree(data, false),
                Err(format!("invalid SSE chunk: {message}")),
                "{data}"
            );
        }
    }

    #[test]
    fn duplicate_keys_keep_the_value_paths_last_one() {
        let c = agree(
            r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(c.choices[0].text, "b");
        let c = agree(
            r#"{"choices":[{"index":0,"token_ids":[1,-1],"token_ids":[2]}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(c.choices[0].token_ids, Some(vec![2]));
        let c = agree(
            r#"{"choices":[{"index":5}],"id":"a","choices":[{"index":0}],"id":"b"}"#,
            false,
        )
        .unwrap();
        assert_eq!((c.choices[0].index, c.id.as_deref()), (0, Some("b")));
        // Duplicates of a skipped key do not matter.
        agree(r#"{"choices":[],"model":"a","model":1}"#, true).unwrap();
    }

    #[test]
    fn which_field_counts_is_the_value_paths_choice() {
        // The choice's own token_ids (even null) win over the delta's.
        assert_eq!(
            choice0(r#"{"choices":[{"index":0,"token_ids":null,"delta":{"token_ids":[1]}}]}"#)
                .token_ids,
            None
        );
        assert_eq!(
            choice0(r#"{"choices":[{"index":0,"delta":{"token_ids":[1]}}]}"#).token_ids,
            Some(vec![1])
        );
        // A delta hides `text`, a null delta does not.
        assert_eq!(
            choice0(r#"{"choices":[{"index":0,"text":"t","delta":{}}]}"#).text,
            ""
        );
        assert_eq!(
            choice0(r#"{"choices":[{"index":0,"text":"t","delta":null}]}"#).text,
            "t"
        );
        // Fields the Value path does not look at may be of any type there;
        // the typed path leaves them to it.
        assert_eq!(
            agree(
                r#"{"choices":[{"index":0,"text":5,"delta":{"content":"c"}}]}"#,
                false
            )
            .unwrap()
            .choices[0]
                .text,
            "c"
        );
        assert_eq!(
            agree(
                r#"{"choices":[{"index":0,"token_ids":[1],"delta":{"token_ids":"x"}}]}"#,
                false
            )
            .unwrap()
            .choices[0]
                .token_ids,
            Some(vec![1])
        );
        assert!(agree(r#"{"object":5,"choices":[]}"#, false).is_ok());
    }

    #[test]
    fn error_objects_are_the_value_paths_errors() {
        assert_eq!(
            agree(r#"{"choices":[],"error":{"message":"boom"}}"#, false),
            Err("server error in SSE stream: boom".into())
        );
        assert_eq!(
            agree(r#"{"error":null}"#, false),
            Err("server error in SSE stream: null".into())
        );
        assert_eq!(
            agree(r#"{"object":"error","message":"bad","choices":[]}"#, false),
            Err("server error in SSE stream: bad".into())
        );
    }

    #[test]
    fn nesting_beyond_the_limit_fails_in_a_skipped_field_too() {
        let deep = format!(
            r#"{{"choices":[],"x":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(
            agree(&deep, false),
            Err("invalid JSON in SSE data: recursion limit exceeded at line 1 column 145".into())
        );
        let ok = format!(
            r#"{{"choices":[],"x":{}{}}}"#,
            "[".repeat(100),
            "]".repeat(100)
        );
        agree(&ok, true).unwrap();
    }
}
