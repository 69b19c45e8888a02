//! Provenance, text and notice records (kinds 2-4), decoded as views into
//! the datagram, with the per-record rules of docs/PROTOCOL.md.

use super::reader::{le_u32, Reader};
use super::*;

/// One provenance record (a view into the datagram: decoding allocates no
/// per-record memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProvRecord<'a> {
    pub stream: u16,
    pub flags: u8,
    pub finish_reason: u8,
    pub offset: u32,
    pub drafts_scheduled: u16,
    pub drafts_padded: u16,
    /// `4 * n` bytes: the token ids, little-endian `u32` each.
    pub token_ids_raw: &'a [u8],
    /// `n` roles.
    pub roles: &'a [u8],
}

impl ProvRecord<'_> {
    /// Number of tokens.
    #[inline]
    pub fn len(&self) -> usize {
        self.roles.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    /// The token ids, in order.
    #[inline]
    pub fn token_ids(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.token_ids_raw.chunks_exact(4).map(le_u32)
    }
}

/// One token of a text record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextToken {
    pub token_id: u32,
    pub frag_len: u16,
    pub span_back: u8,
    /// With a fragment: bytes at its start from the span_back predecessors.
    /// With an empty fragment: the token's give count, how many of its bytes
    /// the next non-empty fragment carries. [`LEAD_UNKNOWN`]: not known.
    pub lead_len: u16,
}

/// One text record (a view into the datagram). `fragments` is the
/// concatenation of every token's fragment (each valid UTF-8 on its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextRecord<'a> {
    pub stream: u16,
    pub flags: u8,
    pub finish_reason: u8,
    pub offset: u32,
    pub trimmed_tokens: u16,
    /// `9 * n` bytes: per token `u32 token_id`, `u16 frag_len`, `u8 span_back`,
    /// `u16 lead_len`.
    pub tokens_raw: &'a [u8],
    pub fragments: &'a [u8],
    pub http_delta: &'a str,
}

#[inline]
fn text_token(t: &[u8]) -> TextToken {
    TextToken {
        token_id: le_u32(t),
        frag_len: u16::from_le_bytes([t[4], t[5]]),
        span_back: t[6],
        lead_len: u16::from_le_bytes([t[7], t[8]]),
    }
}

impl TextRecord<'_> {
    /// Number of tokens.
    #[inline]
    pub fn len(&self) -> usize {
        self.tokens_raw.len() / TEXT_TOKEN_BYTES
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.tokens_raw.is_empty()
    }

    /// The tokens, in order.
    #[inline]
    pub fn tokens(&self) -> impl ExactSizeIterator<Item = TextToken> + '_ {
        self.tokens_raw
            .chunks_exact(TEXT_TOKEN_BYTES)
            .map(text_token)
    }

    /// The fragment of each token, in order.
    pub fn fragment_slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut pos = 0usize;
        self.tokens().map(move |t| {
            let s = &self.fragments[pos..pos + t.frag_len as usize];
            pos += t.frag_len as usize;
            s
        })
    }
}

/// One notice record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoticeRecord<'a> {
    pub stream: u16,
    pub code: u16,
    pub message: &'a str,
}

fn record_count(r: &mut Reader<'_>) -> Result<usize, DecodeError> {
    let n = r.u16()?;
    if n == 0 || n as usize > MAX_RECORDS {
        return Err(DecodeError::RecordCount { n });
    }
    Ok(n as usize)
}

/// Streams seen in this frame. Records normally come in increasing stream
/// order, which proves each new without a set; the first record that does
/// not switches to a bitmap (65 536 values, one bit each) of the streams
/// before it, so the common frame never zeroes those 8 KiB.
struct SeenStreams {
    last: Option<u16>,
    bits: Option<Box<[u64; 1024]>>,
}

impl SeenStreams {
    fn new() -> Self {
        SeenStreams {
            last: None,
            bits: None,
        }
    }

    /// Check a record's stream field is not repeated nor reserved;
    /// `before` are the streams of the frame's earlier records.
    fn check(&mut self, stream: u16, before: impl Iterator<Item = u16>) -> Result<(), DecodeError> {
        let increasing = self.bits.is_none() && self.last.is_none_or(|last| stream > last);
        if !increasing {
            let bits = self.bits.get_or_insert_with(|| {
                let mut bits = Box::new([0u64; 1024]);
                for s in before {
                    bits[s as usize / 64] |= 1 << (s % 64);
                }
                bits
            });
            let (w, b) = (stream as usize / 64, stream as usize % 64);
            if bits[w] & (1 << b) != 0 {
                return Err(DecodeError::RepeatedStream { stream });
            }
            bits[w] |= 1 << b;
        }
        if stream == ALL_STREAMS {
            return Err(DecodeError::ReservedStream);
        }
        self.last = Some(stream);
        Ok(())
    }
}

fn check_finish(stream: u16, flags: u8, reason: u8) -> Result<(), DecodeError> {
    let finished = flags & FLAG_FINISHED != 0;
    if reason > 4 || (reason != 0) != finished {
        return Err(DecodeError::FinishMismatch {
            stream,
            reason,
            finished,
        });
    }
    Ok(())
}

fn check_token_count(stream: u16, offset: u32, n: u16, lo: u16) -> Result<(), DecodeError> {
    if n < lo || n as usize > MAX_TOKENS_PER_RECORD {
        return Err(DecodeError::TokenCount { stream, n, lo });
    }
    if offset.checked_add(n as u32).is_none() {
        return Err(DecodeError::OffsetOverflow { stream, offset, n });
    }
    Ok(())
}

fn role_letter(r: u8) -> char {
    match r {
        ROLE_PLAIN => 'P',
        ROLE_ACCEPTED => 'A',
        ROLE_TARGET => 'T',
        _ => 'B',
    }
}

/// The role rules of docs/PROTOCOL.md "provenance"; returns the number of
/// accepted drafts (the leading `A`s).
#[inline(always)]
pub(super) fn check_roles(
    stream: u16,
    roles: &[u8],
    scheduled: u16,
    trimmed: bool,
) -> Result<usize, DecodeError> {
    let n = roles.len();
    let accepted = roles.iter().take_while(|&&r| r == ROLE_ACCEPTED).count();
    // Every role before `accepted` is A: the first unknown one is after it.
    if let Some(i) = roles[accepted..].iter().position(|&r| r > ROLE_BONUS) {
        return Err(DecodeError::UnknownRole {
            stream,
            role: roles[accepted + i],
            index: accepted + i,
        });
    }
    let ok = if scheduled == 0 {
        n == 1 && roles[0] == ROLE_PLAIN
    } else if accepted == n {
        trimmed && accepted <= scheduled as usize
    } else if accepted + 1 == n {
        match roles[n - 1] {
            ROLE_TARGET => accepted < scheduled as usize,
            ROLE_BONUS => accepted == scheduled as usize,
            _ => false,
        }
    } else {
        false
    };
    if !ok {
        return Err(DecodeError::RoleSequence {
            stream,
            seq: roles.iter().map(|&r| role_letter(r)).collect(),
        });
    }
    Ok(accepted)
}

pub(super) fn decode_provenance<'a>(
    r: &mut Reader<'a>,
    mut out: Vec<ProvRecord<'a>>,
) -> Result<Vec<ProvRecord<'a>>, DecodeError> {
    let count = record_count(r)?;
    let mut seen = SeenStreams::new();
    out.clear();
    out.reserve(count);
    for _ in 0..count {
        // A record's fixed fields bounds-checked at once when all are there
        // (`Reader::take_f`); field by field near the end of the body.
        if r.left() >= PROV_HEAD_BYTES {
            prov_record::<false>(r, &mut seen, &mut out)?;
        } else {
            prov_record_checked(r, &mut seen, &mut out)?;
        }
    }
    Ok(out)
}

/// Bytes of a provenance record's fixed fields (stream to drafts_padded).
const PROV_HEAD_BYTES: usize = 14;

/// [`prov_record`] field by field, near the end of a body (rare: the
/// checks of the common case stay inlined in the loop).
#[cold]
#[inline(never)]
fn prov_record_checked<'a>(
    r: &mut Reader<'a>,
    seen: &mut SeenStreams,
    out: &mut Vec<ProvRecord<'a>>,
) -> Result<(), DecodeError> {
    prov_record::<true>(r, seen, out)
}

/// One provenance record; `CHECKED` false: its fixed fields are all there.
#[inline(always)]
fn prov_record<'a, const CHECKED: bool>(
    r: &mut Reader<'a>,
    seen: &mut SeenStreams,
    out: &mut Vec<ProvRecord<'a>>,
) -> Result<(), DecodeError> {
    let stream = r.u16_f::<CHECKED>()?;
    seen.check(stream, out.iter().map(|o: &ProvRecord<'_>| o.stream))?;
    let flags = r.u8_f::<CHECKED>()?;
    if flags & !(FLAG_FINISHED | FLAG_TRIMMED) != 0 {
        return Err(DecodeError::InvalidFlags { stream, flags });
    }
    let finish_reason = r.u8_f::<CHECKED>()?;
    check_finish(stream, flags, finish_reason)?;
    let offset = r.u32_f::<CHECKED>()?;
    let n = r.u16_f::<CHECKED>()?;
    check_token_count(stream, offset, n, 1)?;
    let drafts_scheduled = r.u16_f::<CHECKED>()?;
    let drafts_padded = r.u16_f::<CHECKED>()?;
    if drafts_padded > drafts_scheduled {
        return Err(DecodeError::PaddedExceedsScheduled {
            stream,
            padded: drafts_padded,
            scheduled: drafts_scheduled,
        });
    }
    let token_ids_raw = r.take(4 * n as usize)?;
    let roles = r.take(n as usize)?;
    let accepted = check_roles(stream, roles, drafts_scheduled, flags & FLAG_TRIMMED != 0)?;
    // A padded draft slot held no draft: it cannot have been accepted.
    if accepted > usize::from(drafts_scheduled - drafts_padded) {
        return Err(DecodeError::AcceptedExceedsDrafts {
            stream,
            accepted,
            scheduled: drafts_scheduled,
            padded: drafts_padded,
        });
    }
    out.push(ProvRecord {
        stream,
        flags,
        finish_reason,
        offset,
        drafts_scheduled,
        drafts_padded,
        token_ids_raw,
        roles,
    });
    Ok(())
}

pub(super) fn decode_text<'a>(
    r: &mut Reader<'a>,
    mut out: Vec<TextRecord<'a>>,
) -> Result<Vec<TextRecord<'a>>, DecodeError> {
    let count = record_count(r)?;
    let mut seen = SeenStreams::new();
    out.clear();
    out.reserve(count);
    for _ in 0..count {
        // As in `decode_provenance`: the fixed fields checked at once.
        if r.left() >= TEXT_HEAD_BYTES {
            text_record::<false>(r, &mut seen, &mut out)?;
        } else {
            text_record_checked(r, &mut seen, &mut out)?;
        }
    }
    Ok(out)
}

/// Bytes of a text record's fixed fields (stream to http_len).
const TEXT_HEAD_BYTES: usize = 16;

/// [`text_record`] field by field, near the end of a body (rare: the
/// checks of the common case stay inlined in the loop).
#[cold]
#[inline(never)]
fn text_record_checked<'a>(
    r: &mut Reader<'a>,
    seen: &mut SeenStreams,
    out: &mut Vec<TextRecord<'a>>,
) -> Result<(), DecodeError> {
    text_record::<true>(r, seen, out)
}

/// One text record; `CHECKED` false: its fixed fields are all there.
#[inline(always)]
fn text_record<'a, const CHECKED: bool>(
    r: &mut Reader<'a>,
    seen: &mut SeenStreams,
    out: &mut Vec<TextRecord<'a>>,
) -> Result<(), DecodeError> {
    let stream = r.u16_f::<CHECKED>()?;
    seen.check(stream, out.iter().map(|o: &TextRecord<'_>| o.stream))?;
    let flags = r.u8_f::<CHECKED>()?;
    let finished = flags & FLAG_FINISHED != 0;
    let all = FLAG_FINISHED | FLAG_TEXT_TRUNCATED | FLAG_TOKENS_TRIMMED;
    if flags & !all != 0 || (!finished && flags != 0) {
        return Err(DecodeError::InvalidFlags { stream, flags });
    }
    let finish_reason = r.u8_f::<CHECKED>()?;
    check_finish(stream, flags, finish_reason)?;
    // text_truncated and tokens_trimmed both say a stop string ended the request.
    if flags & (FLAG_TEXT_TRUNCATED | FLAG_TOKENS_TRIMMED) != 0 && finish_reason != FINISH_STOP {
        return Err(DecodeError::StopFlagsReason {
            stream,
            flags,
            reason: finish_reason,
        });
    }
    let offset = r.u32_f::<CHECKED>()?;
    let n = r.u16_f::<CHECKED>()?;
    check_token_count(stream, offset, n, if finished { 0 } else { 1 })?;
    let trimmed_tokens = r.u16_f::<CHECKED>()?;
    if trimmed_tokens != 0 && flags & FLAG_TOKENS_TRIMMED == 0 {
        return Err(DecodeError::TrimmedWithoutFlag {
            stream,
            n: trimmed_tokens,
        });
    }
    let http_len = r.u32_f::<CHECKED>()? as usize;
    let tokens_raw = r.take(TEXT_TOKEN_BYTES * n as usize)?;
    // One pass over the entries: their rules, the fragments' total length
    // and whether every fragment starts on a character boundary (a byte
    // read beyond the fragments and HTTP delta can only make this false,
    // which takes the exact path below).
    let frag_start = r.pos;
    let buf = r.buf;
    let mut frag_total = 0usize;
    let mut aligned = true;
    for (index, t) in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES).enumerate() {
        let token = text_token(t);
        if token.span_back != 0 || token.lead_len != 0 {
            check_token_entry(stream, index, token)?;
        }
        aligned &= buf
            .get(frag_start + frag_total)
            .is_none_or(|&b| (b as i8) >= -0x40);
        frag_total += token.frag_len as usize;
    }
    let fragments = r.take(frag_total)?;
    // Fast path: fragments and HTTP delta are adjacent; one validation of
    // both, plus the character-boundary checks where each piece starts.
    let both = if aligned {
        r.buf
            .get(frag_start..frag_start + frag_total + http_len)
            .and_then(|b| fragments_and_delta(b, frag_total))
    } else {
        None
    };
    let starts_char = |s: &str| s.is_char_boundary(frag_total);
    let http_delta = match both {
        Some(s) if starts_char(s) => {
            r.take(http_len)?;
            &s[frag_total..]
        }
        _ => {
            check_fragments(stream, tokens_raw, fragments)?;
            let http = r.take(http_len)?;
            std::str::from_utf8(http).map_err(|_| DecodeError::InvalidUtf8Http { stream })?
        }
    };
    out.push(TextRecord {
        stream,
        flags,
        finish_reason,
        offset,
        trimmed_tokens,
        tokens_raw,
        fragments,
        http_delta,
    });
    Ok(())
}

/// The fragments (`both[..frag_total]`) and the HTTP delta after them as
/// one `str` when valid UTF-8. ASCII is checked first (a word at a time, and
/// ASCII is valid UTF-8): most records are a few ASCII bytes, for which the
/// general check's fixed cost is most of their decoding. A delta that
/// repeats the fragments' bytes
/// (most records: the HTTP text holds nothing back) is compared, not
/// validated again: two valid UTF-8 strings make a valid one, so only the
/// fragments are checked (`std`'s check costs about 10 instructions per
/// byte that is not ASCII; comparing, about one).
#[inline(always)]
fn fragments_and_delta(both: &[u8], frag_total: usize) -> Option<&str> {
    if both.is_ascii() {
        // SAFETY: every byte is below 0x80: valid UTF-8.
        return Some(unsafe { std::str::from_utf8_unchecked(both) });
    }
    let (frags, delta) = both.split_at(frag_total);
    if frags == delta {
        std::str::from_utf8(frags).ok()?;
        // SAFETY: `frags` is valid UTF-8 and `delta` is the same bytes.
        return Some(unsafe { std::str::from_utf8_unchecked(both) });
    }
    std::str::from_utf8(both).ok()
}

/// The per-token rules of a text token entry (docs/PROTOCOL.md "text").
#[inline]
fn check_token_entry(stream: u16, index: usize, t: TextToken) -> Result<(), DecodeError> {
    if t.frag_len == 0 {
        // An empty fragment claims nothing; its lead_len is its give count (any value).
        if t.span_back != 0 {
            return Err(DecodeError::SpanBackOnEmpty {
                stream,
                span_back: t.span_back,
                index,
            });
        }
        return Ok(());
    }
    if t.span_back == 0 && t.lead_len != 0 {
        return Err(DecodeError::LeadWithoutSpanBack {
            stream,
            lead_len: t.lead_len,
            index,
        });
    }
    if t.lead_len != LEAD_UNKNOWN && t.lead_len > t.frag_len {
        return Err(DecodeError::LeadExceedsFragment {
            stream,
            lead_len: t.lead_len,
            frag_len: t.frag_len,
            index,
        });
    }
    Ok(())
}

/// Each fragment must be valid UTF-8 on its own. Fast path: the whole run is
/// valid and every fragment starts on a character boundary (then each piece
/// is valid); otherwise find the first invalid fragment.
fn check_fragments(stream: u16, tokens_raw: &[u8], fragments: &[u8]) -> Result<(), DecodeError> {
    if std::str::from_utf8(fragments).is_ok() {
        let mut pos = 0usize;
        let mut aligned = true;
        for t in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES) {
            if pos < fragments.len() && (fragments[pos] as i8) < -0x40 {
                aligned = false;
                break;
            }
            pos += usize::from(u16::from_le_bytes([t[4], t[5]]));
        }
        if aligned {
            return Ok(());
        }
    }
    let mut pos = 0usize;
    for (index, t) in tokens_raw.chunks_exact(TEXT_TOKEN_BYTES).enumerate() {
        let end = pos + usize::from(u16::from_le_bytes([t[4], t[5]]));
        if std::str::from_utf8(&fragments[pos..end]).is_err() {
            return Err(DecodeError::InvalidUtf8Fragment { stream, index });
        }
        pos = end;
    }
    Ok(())
}

pub(super) fn decode_notice<'a>(r: &mut Reader<'a>) -> Result<Vec<NoticeRecord<'a>>, DecodeError> {
    let count = record_count(r)?;
    let mut out = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let stream = r.u16()?;
        let code = r.u16()?;
        let n = r.u16()?;
        if n as usize > MAX_NOTICE_BYTES {
            return Err(DecodeError::NoticeTooLong { stream, n });
        }
        let msg = r.take(n as usize)?;
        let message =
            std::str::from_utf8(msg).map_err(|_| DecodeError::NoticeInvalidUtf8 { stream })?;
        out.push(NoticeRecord {
            stream,
            code,
            message,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::fragments_and_delta;

    /// The same answer as `std::str::from_utf8` on the whole, at every
    /// split, for every byte string of up to 3 bytes over a set of ASCII,
    /// lead, continuation and invalid bytes, placed after 0 to 9 ASCII bytes
    /// (across the word boundary), and for each such string followed by
    /// itself split in the middle (a delta that repeats the fragments).
    #[test]
    fn fragments_and_delta_agree_with_std() {
        let alphabet = [
            0x00, 0x41, 0x7f, 0x80, 0xa9, 0xbf, 0xc2, 0xc3, 0xe2, 0xed, 0xf0, 0xf4, 0xff,
        ];
        let mut doubled_valid = 0;
        for pad in 0..10 {
            for a in alphabet {
                for b in alphabet {
                    for c in alphabet {
                        let mut v = vec![b'x'; pad];
                        v.extend([a, b, c]);
                        for end in pad..=v.len() {
                            let s = &v[..end];
                            let want = std::str::from_utf8(s).ok();
                            for k in 0..=s.len() {
                                assert_eq!(fragments_and_delta(s, k), want, "{s:?} at {k}");
                            }
                            let twice = [s, s].concat();
                            let want = std::str::from_utf8(&twice).ok();
                            doubled_valid += usize::from(want.is_some());
                            assert_eq!(fragments_and_delta(&twice, s.len()), want, "{twice:?}");
                        }
                    }
                }
            }
        }
        assert!(doubled_valid > 1_000, "{doubled_valid}");
    }
}
