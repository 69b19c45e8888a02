/* parallelhue_vllm._speedups: optional C versions of the plugin's hottest code.
 *
 * Built when a C compiler is there at install time (setup.py, optional=True);
 * without it the pure-Python code in hooks.py and wire.py does the same work
 * (accelerator.py chooses, once per process). The pure-Python code is the
 * reference: tests check that both produce the same bytes and refuse the
 * same inputs.
 *
 * - SchedRequest, scheduler_rows(...): the EngineCore loop over a step's
 *   outputs (hooks.SchedulerTelemetry.after / _python_rows).
 * - StreamRecorder(stream, fragments, recover), CaptureState(...): the API
 *   server's stand-ins for a detokenizer's decode stream and a request's output
 *   queue (hooks._StreamRecorder, hooks._QueueCapture: put only notes the
 *   output); take_rows(seen): the step's rows of the noted outputs, in one loop
 *   (hooks._take_rows).
 * - encode_provenance_step(meta, ids, roles), encode_text_step(meta, ids,
 *   texts, fragments, span_backs[, leads]): a step's record bytes as wire.py's
 *   functions of the same names; encode_provenance_body / encode_text_body (same
 *   arguments): those records joined in one bytes object, the frame body the
 *   emitter's sender thread sends (emitter.encode_chunks); encode_provenance_frame /
 *   encode_text_frame (the header fields first): the whole frame of such a body,
 *   wire.encode_joined_frame's bytes, written at once (emitter.Emitter.process);
 *   the text encoder writes protocol 3's entry (lead_len: a fragment's split, or
 *   an empty fragment's give count); tests/test_wire_speedups.py compares the
 *   bytes on random steps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_TOKENS_PER_RECORD 256
#define LEAD_UNKNOWN 0xFFFF
#define PROVENANCE_HEADER 14
#define TEXT_HEADER 16
#define TEXT_ENTRY 9
#define ROW_WIDTH 7
/* The text flags wire.py defines (finished 1, text truncated 2, tokens trimmed 4). */
#define TEXT_FLAG_BITS 7
#define FLAG_BITS_ONLY 0
/* The Python side's contract with this file (accelerator.EXPECTED_ABI): bump it
 * with any change of a function's arguments, of the row layout or of the bytes. */
#define SPEEDUPS_ABI 7

/* ------------------------------------------------------------- helpers */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *obj)
{
    Py_INCREF(obj);
    return obj;
}
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Little-endian stores. On a little-endian host one (unaligned) store each: the
 * byte-by-byte form was compiled into shifts and ors, ~30 instructions per text
 * entry. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define NATIVE_LITTLE_ENDIAN 1
#else
#define NATIVE_LITTLE_ENDIAN 0
#endif

static ALWAYS_INLINE void
put16(unsigned char *p, unsigned long v)
{
#if NATIVE_LITTLE_ENDIAN
    uint16_t w = (uint16_t)v;
    memcpy(p, &w, 2);
#else
    p[0] = (unsigned char)(v & 0xFF);
    p[1] = (unsigned char)((v >> 8) & 0xFF);
#endif
}

static ALWAYS_INLINE void
put32(unsigned char *p, unsigned long v)
{
#if NATIVE_LITTLE_ENDIAN
    uint32_t w = (uint32_t)v;
    memcpy(p, &w, 4);
#else
    p[0] = (unsigned char)(v & 0xFF);
    p[1] = (unsigned char)((v >> 8) & 0xFF);
    p[2] = (unsigned char)((v >> 16) & 0xFF);
    p[3] = (unsigned char)((v >> 24) & 0xFF);
#endif
}

/* memcpy for the few bytes of most fragments, without a call: two fixed-size
 * copies that overlap in the middle (each a single load and store), within
 * the `length` bytes of both sides. */
static ALWAYS_INLINE void
copy_short(unsigned char *to, const char *from, Py_ssize_t length)
{
    if (length >= 8 && length <= 16) {
        memcpy(to, from, 8);
        memcpy(to + length - 8, from + length - 8, 8);
    } else if (length >= 4 && length < 8) {
        memcpy(to, from, 4);
        memcpy(to + length - 4, from + length - 4, 4);
    } else if (length > 16) {
        memcpy(to, from, (size_t)length);
    } else {
        for (Py_ssize_t i = 0; i < length; i++) {
            to[i] = (unsigned char)from[i];
        }
    }
}

/* The value of an exact int that fits one machine word's digit (nearly every
 * field: ids, offsets, counts), without a call; 0 when not such an int. */
static inline int
small_int(PyObject *value, long long *out)
{
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)value)) {
        *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)value);
        return 1;
    }
#else
    Py_ssize_t size = Py_SIZE(value);
    if (size == 0 || size == 1) {
        *out = size ? (long long)((PyLongObject *)value)->ob_digit[0] : 0;
        return 1;
    }
#endif
    return 0;
}

/* UTF-8 of a str: an ASCII string's own bytes (no call), else the cached UTF-8. */
static ALWAYS_INLINE const char *
utf8_of(PyObject *text, Py_ssize_t *length)
{
    if (PyUnicode_IS_COMPACT_ASCII(text)) {
        *length = PyUnicode_GET_LENGTH(text);
        return (const char *)PyUnicode_DATA(text);
    }
    return PyUnicode_AsUTF8AndSize(text, length);
}

/* An int in 0..limit, or -1 with ValueError("<what> field out of range ..."). */
static inline long long
field(PyObject *value, unsigned long long limit, const char *kind)
{
    long long small;
    if (small_int(value, &small) && small >= 0 && (unsigned long long)small <= limit) {
        return small;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s record field is not an int", kind);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow || v < 0 || (unsigned long long)v > limit) {
        PyErr_Format(PyExc_ValueError, "%s record field out of range: %R not in 0..%llu", kind,
                     value, limit);
        return -1;
    }
    return v;
}

/* The defined bits of a text record's flags, as wire.py reads them (any int:
 * `flags & bit` for each flag, the other bits ignored); -1 with TypeError if no int. */
static long long
text_flag_bits(PyObject *value)
{
    if (!PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "text record field is not an int");
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (!overflow) {
        return v == -1 && PyErr_Occurred() ? -1 : (v & TEXT_FLAG_BITS);
    }
    PyObject *mask = PyLong_FromLong(TEXT_FLAG_BITS);
    PyObject *bits = mask ? PyNumber_And(value, mask) : NULL;
    Py_XDECREF(mask);
    if (bits == NULL) {
        return -1;
    }
    v = PyLong_AsLongLong(bits);
    Py_DECREF(bits);
    return v;
}

/* ---------------------------------------------------- step encoders */
/* The 7 ints of record `r` of a meta column, range-checked (ValueError otherwise);
 * a limit of FLAG_BITS_ONLY: text flags, read as text_flag_bits. */
static ALWAYS_INLINE int
record_meta(PyObject *meta, Py_ssize_t r, const unsigned long long *limits, const char *kind,
            long long *out)
{
    /* Nearly always: seven small ints in range, read without a call. */
    PyObject **items = ((PyListObject *)meta)->ob_item + r * ROW_WIDTH;
    int i = 0;
    /* unrolled: each field's limit is then a constant */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 7
#endif
    for (; i < ROW_WIDTH; i++) {
        long long v;
        if (!small_int(items[i], &v) || v < 0) {
            break;
        }
        if (limits[i] == FLAG_BITS_ONLY) {
            v &= TEXT_FLAG_BITS;
        } else if ((unsigned long long)v > limits[i]) {
            break;
        }
        out[i] = v;
    }
    if (i == ROW_WIDTH) {
        return 0;
    }
    for (i = 0; i < ROW_WIDTH; i++) {
        PyObject *value = PyList_GET_ITEM(meta, r * ROW_WIDTH + i);
        out[i] = limits[i] == FLAG_BITS_ONLY ? text_flag_bits(value) : field(value, limits[i], kind);
        if (out[i] < 0) {
            return -1;
        }
    }
    return 0;
}

static int
check_columns(PyObject *meta, Py_ssize_t records, Py_ssize_t ids, Py_ssize_t tokens)
{
    if (PyList_GET_SIZE(meta) != ROW_WIDTH * records || ids != tokens) {
        PyErr_Format(PyExc_ValueError,
                     "step columns disagree: %zd meta ints for %zd records, %zd ids for %zd "
                     "tokens",
                     PyList_GET_SIZE(meta), records, ids, tokens);
        return -1;
    }
    return 0;
}

/* Where a step encoder writes its records: a list of one bytes object per record
 * (the *_step functions), or one bytes object of them all, joined (the *_body
 * functions: the sender's frame body, without a bytes object per record and the join). */
typedef struct {
    PyObject *list;   /* list mode: PyList_New(records), items set as written */
    PyObject *joined; /* body mode: the body so far (over-allocated until sink_finish) */
    Py_ssize_t used;
} Sink;

/* Where the encoders write: one bytes object per record, the records joined (a
 * frame body), or a whole frame (header, record count, body). */
enum { RECORDS = 0, BODY = 1, FRAME = 2 };
#define FRAME_HEADER 64
#define FRAME_PREFIX (FRAME_HEADER + 2)
#define MAX_FRAME_BYTES 65536
#define MAX_RECORDS 1024
#define PROTOCOL_VERSION 3
#define KIND_PROVENANCE 2
#define KIND_TEXT 3

/* The header fields of a frame (wire.Header), read by frame_head. */
typedef struct {
    const char *run_id;
    unsigned long long source_id, seq, step, timestamp, dropped;
} FrameHead;

static void
put64(unsigned char *p, unsigned long long v)
{
    put32(p, (unsigned long)(v & 0xFFFFFFFFULL));
    put32(p + 4, (unsigned long)(v >> 32));
}

/* args = run_id, source_id, seq, step, timestamp_ns, dropped: 1 when each fits
 * the header (wire._HEADER; dropped above 0xFFFFFFFF is clamped, as the emitter
 * does), 0 otherwise (no error set: the caller takes the Python path, which
 * raises what struct raises). */
static int
frame_head(PyObject *const *args, FrameHead *head)
{
    if (!PyBytes_CheckExact(args[0]) || PyBytes_GET_SIZE(args[0]) != 16) {
        return 0;
    }
    head->run_id = PyBytes_AS_STRING(args[0]);
    unsigned long long *fields[] = {&head->source_id, &head->seq, &head->step, &head->timestamp,
                                    &head->dropped};
    for (int i = 0; i < 5; i++) {
        if (!PyLong_CheckExact(args[1 + i])) {
            return 0;
        }
        *fields[i] = PyLong_AsUnsignedLongLong(args[1 + i]);
        if (*fields[i] == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            if (i == 4 && _PyLong_Sign(args[1 + i]) > 0) {
                *fields[i] = 0xFFFFFFFFULL; /* a count beyond u64: clamped all the same */
                continue;
            }
            return 0;
        }
    }
    if (head->dropped > 0xFFFFFFFFULL) {
        head->dropped = 0xFFFFFFFFULL;
    }
    return 1;
}

static int
sink_open(Sink *sink, int joined, Py_ssize_t records, Py_ssize_t estimate)
{
    /* a frame's header and record count go first (FRAME mode): room kept for them */
    Py_ssize_t start = joined == FRAME ? FRAME_PREFIX : 0;
    estimate += start;
    sink->used = start;
    sink->list = NULL;
    sink->joined = NULL;
    if (joined) {
        sink->joined = PyBytes_FromStringAndSize(NULL, estimate > 0 ? estimate : 1);
        return sink->joined == NULL ? -1 : 0;
    }
    sink->list = PyList_New(records);
    return sink->list == NULL ? -1 : 0;
}

/* Room for record `r` of `size` bytes (NULL with MemoryError). */
static ALWAYS_INLINE unsigned char *
sink_record(Sink *sink, Py_ssize_t r, Py_ssize_t size)
{
    if (sink->list != NULL) {
        PyObject *out = PyBytes_FromStringAndSize(NULL, size);
        if (out == NULL) {
            return NULL;
        }
        PyList_SET_ITEM(sink->list, r, out);
        return (unsigned char *)PyBytes_AS_STRING(out);
    }
    Py_ssize_t need = sink->used + size, room = PyBytes_GET_SIZE(sink->joined);
    if (need > room) {
        if (_PyBytes_Resize(&sink->joined, need > 2 * room ? need : 2 * room) < 0) {
            return NULL; /* sink->joined is NULL now */
        }
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(sink->joined) + sink->used;
    sink->used = need;
    return p;
}

static PyObject *
sink_finish(Sink *sink)
{
    if (sink->list != NULL) {
        return sink->list;
    }
    if (_PyBytes_Resize(&sink->joined, sink->used) < 0) {
        return NULL;
    }
    return sink->joined;
}

/* FRAME mode: the frame wire.encode_joined_frame makes of these records, or None
 * when they do not fit one frame (the emitter then splits them in Python). */
static PyObject *
sink_frame(Sink *sink, int kind, const FrameHead *head, Py_ssize_t records)
{
    Py_ssize_t body_len = sink->used - FRAME_HEADER; /* the count and the records */
    if (records < 1 || records > MAX_RECORDS || FRAME_HEADER + body_len > MAX_FRAME_BYTES) {
        Py_CLEAR(sink->joined);
        Py_RETURN_NONE;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(sink->joined);
    memcpy(p, "PHUE", 4);
    p[4] = PROTOCOL_VERSION;
    p[5] = (unsigned char)kind;
    put16(p + 6, 0);
    memcpy(p + 8, head->run_id, 16);
    put64(p + 24, head->source_id);
    put64(p + 32, head->seq);
    put64(p + 40, head->step);
    put64(p + 48, head->timestamp);
    put32(p + 56, (unsigned long)head->dropped);
    put32(p + 60, (unsigned long)body_len);
    put16(p + FRAME_HEADER, (unsigned long)records);
    return sink_finish(sink);
}

static void
sink_drop(Sink *sink)
{
    Py_XDECREF(sink->list);
    Py_XDECREF(sink->joined);
}

/* encode_provenance_step(meta, ids, roles) -> list[bytes] (wire.encode_provenance_step);
 * encode_provenance_body(meta, ids, roles) -> bytes: the same records, joined. */
static PyObject *
encode_provenance(PyObject *const *args, Py_ssize_t nargs, int joined, const FrameHead *head)
{
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        joined == FRAME ? "encode_provenance_frame(run_id, source_id, seq, step, "
                                          "timestamp_ns, dropped, meta, ids, roles)"
                        : joined        ? "encode_provenance_body(meta, ids, roles): three lists"
                                        : "encode_provenance_step(meta, ids, roles): three lists");
        return NULL;
    }
    PyObject *meta = args[0], *ids = args[1], *roles = args[2];
    static const unsigned long long limits[ROW_WIDTH] = {
        0xFFFF, 0xFF, 0xFF, 0xFFFFFFFFULL, MAX_TOKENS_PER_RECORD, 0xFFFF, 0xFFFF};
    Py_ssize_t records = PyList_GET_SIZE(roles), n_ids = PyList_GET_SIZE(ids), first = 0;
    if (PyList_GET_SIZE(meta) < ROW_WIDTH * records) {
        check_columns(meta, records, n_ids, -1);
        return NULL;
    }
    Sink sink;
    if (sink_open(&sink, joined, records, records * PROVENANCE_HEADER + 5 * n_ids) < 0) {
        return NULL;
    }
    for (Py_ssize_t r = 0; r < records; r++) {
        long long v[ROW_WIDTH];
        if (record_meta(meta, r, limits, "provenance", v) < 0) {
            goto fail;
        }
        Py_ssize_t count = (Py_ssize_t)v[4];
        PyObject *record_roles = PyList_GET_ITEM(roles, r);
        if (!PyBytes_Check(record_roles)) {
            PyErr_SetString(PyExc_TypeError, "provenance step: roles must be bytes");
            goto fail;
        }
        if (PyBytes_GET_SIZE(record_roles) != count) {
            PyErr_Format(PyExc_ValueError, "record for stream %lld: %zd roles for %zd tokens",
                         v[0], PyBytes_GET_SIZE(record_roles), count);
            goto fail;
        }
        if (first + count > n_ids) {
            check_columns(meta, records, n_ids, first + count);
            goto fail;
        }
        unsigned char *p = sink_record(&sink, r, PROVENANCE_HEADER + 5 * count);
        if (p == NULL) {
            goto fail;
        }
        put16(p, (unsigned long)v[0]);
        p[2] = (unsigned char)v[1];
        p[3] = (unsigned char)v[2];
        put32(p + 4, (unsigned long)v[3]);
        put16(p + 8, (unsigned long)count);
        put16(p + 10, (unsigned long)v[5]);
        put16(p + 12, (unsigned long)v[6]);
        p += PROVENANCE_HEADER;
        for (Py_ssize_t i = 0; i < count; i++) {
            long long id = field(PyList_GET_ITEM(ids, first + i), 0xFFFFFFFFULL, "provenance");
            if (id < 0) {
                goto fail;
            }
            put32(p + 4 * i, (unsigned long)id);
        }
        memcpy(p + 4 * count, PyBytes_AS_STRING(record_roles), (size_t)count);
        first += count;
    }
    if (check_columns(meta, records, n_ids, first) < 0) {
        goto fail;
    }
    return joined == FRAME ? sink_frame(&sink, KIND_PROVENANCE, head, records)
                           : sink_finish(&sink);
fail:
    sink_drop(&sink);
    return NULL;
}

static PyObject *
encode_provenance_step(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return encode_provenance(args, nargs, RECORDS, NULL);
}

static PyObject *
encode_provenance_body(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return encode_provenance(args, nargs, BODY, NULL);
}

/* encode_provenance_frame(run_id, source_id, seq, step, timestamp_ns, dropped, meta,
 * ids, roles) -> bytes | None: the whole frame (wire.encode_joined_frame of the
 * body), or None when the header fields or the records do not fit one frame. */
static PyObject *
encode_provenance_frame(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    FrameHead head;
    if (nargs < 6 || !frame_head(args, &head)) {
        Py_RETURN_NONE;
    }
    return encode_provenance(args + 6, nargs - 6, FRAME, &head);
}

/* encode_text_step(meta, ids, texts, fragments, span_backs[, leads]) -> list[bytes];
 * encode_text_body(the same) -> bytes: the same records, joined. */
static PyObject *
encode_text(PyObject *const *args, Py_ssize_t nargs, int joined, const FrameHead *head)
{
    if ((nargs != 5 && nargs != 6) || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
        !PyList_Check(args[2]) || !PyList_Check(args[3]) || !PyDict_Check(args[4]) ||
        (nargs == 6 && !PyDict_Check(args[5]))) {
        PyErr_SetString(
            PyExc_TypeError,
            joined == FRAME ? "encode_text_frame(run_id, source_id, seq, step, timestamp_ns, "
                              "dropped, meta, ids, texts, fragments, span_backs[, leads])"
            : joined        ? "encode_text_body(meta, ids, texts, fragments, span_backs[, leads])"
                            : "encode_text_step(meta, ids, texts, fragments, span_backs[, leads])");
        return NULL;
    }
    PyObject *meta = args[0], *ids = args[1], *texts = args[2], *fragments = args[3];
    PyObject *span_backs = args[4];
    PyObject *leads_of = nargs == 6 ? args[5] : NULL;
    static const unsigned long long limits[ROW_WIDTH] = {
        0xFFFF, FLAG_BITS_ONLY, 0xFF, 0xFFFFFFFFULL, MAX_TOKENS_PER_RECORD, 0xFFFFFFFFULL, 0xFFFF};
    Py_ssize_t records = PyList_GET_SIZE(texts);
    Py_ssize_t n_ids = PyList_GET_SIZE(ids), n_fragments = PyList_GET_SIZE(fragments);
    Py_ssize_t first_id = 0, first_fragment = 0;
    if (PyList_GET_SIZE(meta) < ROW_WIDTH * records) {
        check_columns(meta, records, n_ids, -1);
        return NULL;
    }
    Sink sink;
    /* room for the headers, the entries and about 8 bytes of text per token */
    if (sink_open(&sink, joined, records, records * TEXT_HEADER + (TEXT_ENTRY + 8) * n_ids) < 0) {
        return NULL;
    }
    for (Py_ssize_t r = 0; r < records; r++) {
        long long v[ROW_WIDTH];
        if (record_meta(meta, r, limits, "text", v) < 0) {
            goto fail;
        }
        /* A record owns `fed` fragments, those of its first `used` tokens (as wire.py:
           fragments owned beyond its tokens are skipped). */
        Py_ssize_t count = (Py_ssize_t)v[4], fed = (Py_ssize_t)v[5];
        Py_ssize_t used = fed < count ? fed : count;
        PyObject *text = PyList_GET_ITEM(texts, r);
        if (!PyUnicode_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "text step: an HTTP text is not a str");
            goto fail;
        }
        PyObject *backs = NULL;
        if (PyDict_GET_SIZE(span_backs)) {
            PyObject *key = PyLong_FromSsize_t(r);
            if (key == NULL) {
                goto fail;
            }
            backs = PyDict_GetItemWithError(span_backs, key);
            Py_DECREF(key);
            if (backs == NULL && PyErr_Occurred()) {
                goto fail;
            }
            if (backs != NULL && (!PyList_Check(backs) || PyList_GET_SIZE(backs) < count)) {
                PyErr_Format(PyExc_ValueError, "text record: span_backs for %zd tokens needed",
                             count);
                goto fail;
            }
        }
        PyObject *leads = NULL; /* lead_lens of this record, for every token (NULL: none) */
        if (leads_of != NULL && PyDict_GET_SIZE(leads_of)) {
            PyObject *key = PyLong_FromSsize_t(r);
            if (key == NULL) {
                goto fail;
            }
            leads = PyDict_GetItemWithError(leads_of, key);
            Py_DECREF(key);
            if (leads == NULL && PyErr_Occurred()) {
                goto fail;
            }
            if (leads != NULL && (!PyList_Check(leads) || PyList_GET_SIZE(leads) != count)) {
                PyErr_Format(PyExc_ValueError, "text record: lead_lens for %zd tokens needed",
                             count);
                goto fail;
            }
        }
        if (first_id + count > n_ids || first_fragment + fed > n_fragments) {
            PyErr_Format(PyExc_ValueError,
                         "text step: records own more than the step's %zd ids and %zd fragments",
                         n_ids, n_fragments);
            goto fail;
        }
        Py_ssize_t http_len;
        const char *http = utf8_of(text, &http_len);
        if (http == NULL) {
            goto fail;
        }
        if ((unsigned long long)http_len > 0xFFFFFFFFULL) {
            PyErr_SetString(PyExc_ValueError, "text record field out of range: http_len");
            goto fail;
        }
        Py_ssize_t size = TEXT_HEADER + TEXT_ENTRY * count + http_len;
        /* each fragment's UTF-8, found once (used <= count <= MAX_TOKENS_PER_RECORD,
           as record_meta checked) */
        const char *piece_bytes[MAX_TOKENS_PER_RECORD];
        Py_ssize_t piece_lengths[MAX_TOKENS_PER_RECORD];
        for (Py_ssize_t i = 0; i < used; i++) {
            PyObject *piece = PyList_GET_ITEM(fragments, first_fragment + i);
            Py_ssize_t length;
            if (!PyUnicode_Check(piece)) {
                PyErr_SetString(PyExc_TypeError, "text step: a fragment is not a str");
                goto fail;
            }
            if ((piece_bytes[i] = utf8_of(piece, &length)) == NULL) {
                goto fail;
            }
            piece_lengths[i] = length;
            if (length > 0xFFFF) {
                PyErr_SetString(PyExc_ValueError, "text record field out of range: frag_len");
                goto fail;
            }
            size += length;
        }
        unsigned char *p = sink_record(&sink, r, size);
        if (p == NULL) {
            goto fail;
        }
        put16(p, (unsigned long)v[0]);
        p[2] = (unsigned char)v[1];
        p[3] = (unsigned char)v[2];
        put32(p + 4, (unsigned long)v[3]);
        put16(p + 8, (unsigned long)count);
        put16(p + 10, (unsigned long)v[6]);
        put32(p + 12, (unsigned long)http_len);
        unsigned char *entry = p + TEXT_HEADER;
        unsigned char *data = entry + TEXT_ENTRY * count;
        for (Py_ssize_t i = 0; i < count; i++, entry += TEXT_ENTRY) {
            long long id = field(PyList_GET_ITEM(ids, first_id + i), 0xFFFFFFFFULL, "text");
            long long back = 0, lead = 0;
            if (id >= 0 && backs != NULL) {
                back = field(PyList_GET_ITEM(backs, i), 0xFF, "text");
            }
            Py_ssize_t length = 0;
            const char *bytes = NULL;
            if (i < used) {
                bytes = piece_bytes[i];
                length = piece_lengths[i];
            }
            /* wire.encode_text_step: lead_lens pass through for every token (a give
               count on an empty fragment); without them only a fragment's own bytes
               need no split. */
            if (id >= 0 && back >= 0 && leads != NULL) {
                lead = field(PyList_GET_ITEM(leads, i), 0xFFFF, "text");
            } else if (back > 0 || length == 0) {
                lead = LEAD_UNKNOWN;
            }
            if (id < 0 || back < 0 || lead < 0) {
                goto fail;
            }
            copy_short(data, bytes, length);
            data += length;
            put32(entry, (unsigned long)id);
            put16(entry + 4, (unsigned long)length);
            entry[6] = (unsigned char)back;
            put16(entry + 7, (unsigned long)lead);
        }
        memcpy(data, http, (size_t)http_len);
        first_id += count;
        first_fragment += fed;
    }
    if (check_columns(meta, records, n_ids, first_id) < 0) {
        goto fail;
    }
    if (first_fragment != n_fragments) {
        PyErr_Format(PyExc_ValueError, "text step: %zd fragments owned, %zd given", first_fragment,
                     n_fragments);
        goto fail;
    }
    return joined == FRAME ? sink_frame(&sink, KIND_TEXT, head, records) : sink_finish(&sink);
fail:
    sink_drop(&sink);
    return NULL;
}

static PyObject *
encode_text_step(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return encode_text(args, nargs, RECORDS, NULL);
}

static PyObject *
encode_text_body(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return encode_text(args, nargs, BODY, NULL);
}

/* encode_text_frame(run_id, source_id, seq, step, timestamp_ns, dropped, meta, ids,
 * texts, fragments, span_backs[, leads]) -> bytes | None: as encode_provenance_frame. */
static PyObject *
encode_text_frame(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    FrameHead head;
    if (nargs < 6 || !frame_head(args, &head)) {
        Py_RETURN_NONE;
    }
    return encode_text(args + 6, nargs - 6, FRAME, &head);
}

/* The three types below hold their object references in one run of PyObject *
 * fields (first..last, nothing else between them): one traverse, clear and
 * dealloc over that run serves each of them. */
static int
visit_fields(PyObject **fields, size_t count, visitproc visit, void *arg)
{
    for (size_t i = 0; i < count; i++) {
        Py_VISIT(fields[i]);
    }
    return 0;
}

static void
clear_fields(PyObject **fields, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        Py_CLEAR(fields[i]);
    }
}

#define FIELD_COUNT(Type, first, last) \
    ((offsetof(Type, last) - offsetof(Type, first)) / sizeof(PyObject *) + 1)

#define OBJECT_FIELDS_GC(prefix, Type, first, last)                                        \
    static int prefix##_traverse(Type *self, visitproc visit, void *arg)                   \
    {                                                                                      \
        return visit_fields(&self->first, FIELD_COUNT(Type, first, last), visit, arg);     \
    }                                                                                      \
    static int prefix##_clear(Type *self)                                                  \
    {                                                                                      \
        clear_fields(&self->first, FIELD_COUNT(Type, first, last));                        \
        return 0;                                                                          \
    }                                                                                      \
    static void prefix##_dealloc(Type *self)                                               \
    {                                                                                      \
        PyObject_GC_UnTrack(self);                                                         \
        prefix##_clear(self);                                                              \
        Py_TYPE(self)->tp_free((PyObject *)self);                                          \
    }

/* ------------------------------------------------------- StreamRecorder */
/* Stands in for a fast detokenizer's `stream` (hooks._StreamRecorder): step()
 * calls the real stream's step and appends `result or ""` to `fragments`;
 * after an error, `recover(error)` may give the new stream vLLM would make
 * (hooks._reset_stream), else "" is recorded and the error goes on to vLLM. */
typedef struct {
    PyObject_HEAD
    PyObject *stream;
    PyObject *step;      /* stream.step, bound once */
    PyObject *fragments;
    PyObject *recover;   /* recover(error) -> new stream or None; NULL: none */
} StreamRecorder;

static PyObject *str_step, *str_put, *str_empty, *str_finish_reason;

/* The step after an error: the new stream's step when `recover` gives one
 * (it replaces the old stream here), else NULL with the error as it was. */
static PyObject *
recorder_recover(StreamRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    PyObject *stream = PyObject_CallOneArg(self->recover, value != NULL ? value : Py_None);
    PyObject *step = NULL;
    if (stream != NULL && stream != Py_None) {
        step = PyObject_GetAttr(stream, str_step);
    }
    if (step == NULL) {
        PyErr_Clear(); /* recover's own failure: as if it gave nothing */
        Py_XDECREF(stream);
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    PyObject *old_stream = self->stream, *old_step = self->step;
    self->stream = stream;
    self->step = step;
    Py_DECREF(old_stream);
    Py_DECREF(old_step);
    return PyObject_Vectorcall(self->step, args, (size_t)nargs, NULL);
}

static PyObject *
recorder_step(StreamRecorder *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *text = PyObject_Vectorcall(self->step, args, (size_t)nargs, NULL);
    if (text == NULL && self->recover != NULL) {
        text = recorder_recover(self, args, nargs);
    }
    if (text == NULL) {
        /* the stream's own error, as without the plugin; decode_next returns "" when
           vLLM survives it, so that is what is recorded */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (PyList_Append(self->fragments, str_empty) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    PyObject *piece = text;
    if (text == Py_None || (PyUnicode_Check(text) && PyUnicode_GET_LENGTH(text) == 0)) {
        piece = str_empty;
    }
    PyListObject *fragments = (PyListObject *)self->fragments;
    Py_ssize_t size = Py_SIZE(fragments);
    if (fragments->allocated > size) { /* the room the previous step's tokens left */
        Py_INCREF(piece);
        fragments->ob_item[size] = piece;
        Py_SET_SIZE(fragments, size + 1);
    } else if (PyList_Append(self->fragments, piece) < 0) {
        PyErr_Clear(); /* never into vLLM: the count check reports the missing fragment */
    }
    return text;
}

static PyObject *
recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"stream", "fragments", "recover", NULL};
    PyObject *stream, *fragments, *recover = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!|O:StreamRecorder", names, &stream,
                                     &PyList_Type, &fragments, &recover)) {
        return NULL;
    }
    PyObject *step = PyObject_GetAttr(stream, str_step);
    if (step == NULL) {
        return NULL;
    }
    StreamRecorder *self = (StreamRecorder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(step);
        return NULL;
    }
    Py_INCREF(stream);
    Py_INCREF(fragments);
    self->stream = stream;
    self->step = step;
    self->fragments = fragments;
    if (recover != Py_None) {
        Py_INCREF(recover);
        self->recover = recover;
    }
    return (PyObject *)self;
}

OBJECT_FIELDS_GC(recorder, StreamRecorder, stream, recover)

static PyMethodDef recorder_methods[] = {
    {"step", (PyCFunction)(void (*)(void))recorder_step, METH_FASTCALL,
     "step(tokenizer, token_id): the stream's step, its result recorded."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef recorder_members[] = {
    {"stream", T_OBJECT, offsetof(StreamRecorder, stream), READONLY, "the real decode stream"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StreamRecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "parallelhue_vllm._speedups.StreamRecorder",
    .tp_doc = "StreamRecorder(stream, fragments, recover=None): see hooks._StreamRecorder.",
    .tp_basicsize = sizeof(StreamRecorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = recorder_new,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
};

/* ------------------------------------------------------ attribute reads */
/* One attribute of the objects of one type, read where the type keeps it, when
 * the type looks attributes up the default way and answers for the name as
 * PyObject_GetAttr would:
 * - a member descriptor (__slots__, msgspec.Struct fields: vLLM's
 *   EngineCoreOutput(s)): the slot. A member descriptor is a data descriptor:
 *   it wins over an instance dict.
 * - CPython 3.11, a plain class without a descriptor of the name (vLLM's
 *   RequestOutput, the CompletionOutput dataclass: a default value in the class
 *   is no descriptor): the instance's value array, at the name's index in the
 *   keys the class's instances share (found once here; getattr hashes the name
 *   into them on every read, after its type lookup). An instance without the
 *   value, or with a __dict__ made, takes getattr.
 * Any other type, a type changed since (its version tag), other shared keys, a
 * custom __getattribute__, an unset slot or value takes PyObject_GetAttr. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
/* 3.11's layout (Include/internal/pycore_dict.h, pycore_object.h): shared keys
 * of kind DICT_KEYS_SPLIT with unicode entries after the index table; an
 * instance's value array pointer 4 words before the object. */
#define INSTANCE_VALUES 1
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} SharedKeys;
typedef struct {
    PyObject *me_key;
    PyObject *me_value;
} SharedKeyEntry;
#define DICT_KEYS_SPLIT 2

static inline SharedKeyEntry *
shared_entries(SharedKeys *keys)
{
    return (SharedKeyEntry *)(keys->dk_indices + ((size_t)1 << keys->dk_log2_index_bytes));
}

static inline PyObject **
instance_values(PyObject *obj)
{
    return *((PyObject ***)obj - 4);
}
#endif

typedef struct {
    PyTypeObject *type; /* compared only; a type's version tag is never reused */
    unsigned int version;
    Py_ssize_t offset;  /* a slot's offset; -1: not a slot */
    int none_if_unset;  /* T_OBJECT: an unset slot reads as None */
    void *keys;         /* the shared keys `index` is of (NULL: no instance value) */
    Py_ssize_t index;
} SlotReader;

static void
learn_slot(PyTypeObject *type, PyObject *name, SlotReader *reader)
{
    reader->type = NULL;
    reader->offset = -1;
    reader->keys = NULL;
    if (type->tp_getattro != PyObject_GenericGetAttr) {
        return;
    }
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed; assigns a version tag */
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        return;
    }
    reader->type = type;
    reader->version = type->tp_version_tag;
#ifdef INSTANCE_VALUES
    if ((descr == NULL || Py_TYPE(descr)->tp_descr_get == NULL) &&
        (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) && (type->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        SharedKeys *keys = (SharedKeys *)((PyHeapTypeObject *)type)->ht_cached_keys;
        if (keys != NULL && keys->dk_kind == DICT_KEYS_SPLIT) {
            SharedKeyEntry *entries = shared_entries(keys);
            for (Py_ssize_t i = 0; i < keys->dk_nentries; i++) {
                if (entries[i].me_key == name) {
                    reader->keys = keys;
                    reader->index = i;
                    return;
                }
            }
        }
        reader->type = NULL; /* no instance has had the name yet: learn again next time */
        return;
    }
#endif
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        return;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if ((member->type != T_OBJECT_EX && member->type != T_OBJECT) ||
        (member->flags & READ_RESTRICTED)) {
        return;
    }
#ifdef Py_RELATIVE_OFFSET
    if (member->flags & Py_RELATIVE_OFFSET) {
        return;
    }
#endif
    reader->offset = member->offset;
    reader->none_if_unset = member->type == T_OBJECT;
}

/* read_attr's path when the type is not the one learnt (learn it again) or the
 * value is not where it was: out of line, so that the common read is inlined. */
static PyObject *
read_attr_slow(PyObject *obj, PyObject *name, SlotReader *reader)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type != reader->type || type->tp_version_tag != reader->version ||
        !(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        learn_slot(type, name, reader);
    }
    if (reader->offset >= 0) {
        PyObject *value = *(PyObject **)((char *)obj + reader->offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
        if (reader->none_if_unset) {
            Py_RETURN_NONE;
        }
    }
#ifdef INSTANCE_VALUES
    else if (reader->keys != NULL) {
        SharedKeys *keys = (SharedKeys *)((PyHeapTypeObject *)type)->ht_cached_keys;
        PyObject **values = instance_values(obj);
        /* shared keys only ever grow: the index stays the name's while they are the type's */
        if (keys == reader->keys && values != NULL && reader->index < keys->dk_nentries &&
            shared_entries(keys)[reader->index].me_key == name) {
            PyObject *value = values[reader->index];
            if (value != NULL) {
                Py_INCREF(value);
                return value;
            }
        }
    }
#endif
    return PyObject_GetAttr(obj, name);
}

/* obj.<name> as a new reference (NULL with the exception PyObject_GetAttr raises). */
static ALWAYS_INLINE PyObject *
read_attr(PyObject *obj, PyObject *name, SlotReader *reader)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type == reader->type && type->tp_version_tag == reader->version &&
        (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        if (reader->offset >= 0) {
            PyObject *value = *(PyObject **)((char *)obj + reader->offset);
            if (value != NULL) {
                Py_INCREF(value);
                return value;
            }
        }
#ifdef INSTANCE_VALUES
        else if (reader->keys != NULL) {
            SharedKeys *keys = (SharedKeys *)((PyHeapTypeObject *)type)->ht_cached_keys;
            PyObject **values = instance_values(obj);
            if (keys == reader->keys && values != NULL && reader->index < keys->dk_nentries &&
                shared_entries(keys)[reader->index].me_key == name) {
                PyObject *value = values[reader->index];
                if (value != NULL) {
                    Py_INCREF(value);
                    return value;
                }
            }
        }
#endif
    }
    return read_attr_slow(obj, name, reader);
}

static SlotReader read_outputs, read_request_id, read_new_token_ids, read_finish_reason;
/* The frontend capture's reads: RequestOutput.outputs and four CompletionOutput fields. */
static SlotReader read_completions, read_index, read_token_ids, read_completion_finish;
static SlotReader read_text;

/* --------------------------------------------------------- CaptureState */
/* Stands in for a request's output queue (hooks._QueueCapture): put() only
 * notes (capture, output) in the process's `seen` list and calls the real
 * queue's put; take_rows(seen), once per step (the end of process_outputs),
 * takes every noted output's row in one loop. The per-output code is a few
 * instructions: the row's work, which missed the instruction cache when it ran
 * per output between vLLM's own code, runs in that loop instead. */
typedef struct {
    PyObject_HEAD
    PyObject *queue;
    PyObject *put;           /* queue.put, bound once */
    PyObject *seen;          /* the process's list of this step's (capture, output) */
    PyObject *fragments;     /* list: what each token decoded to this step */
    PyObject *meta;          /* the run's columns of this step (hooks._Bucket) */
    PyObject *ids;
    PyObject *texts;
    PyObject *all_fragments;
    PyObject *stream;        /* int */
    PyObject *special;       /* special(token_ids, finish_reason, stop_reason, text, index) */
    PyObject *failed;        /* failed(exception) */
    long long index;
    long long offset;
    long long pending_empty;
    char active;             /* cleared when the request's telemetry ends (hooks._uninstall) */
} CaptureState;

static PyObject *str_outputs, *str_text, *str_index, *str_token_ids, *str_stop_reason;
/* 0..MAX_TOKENS_PER_RECORD, made once (a row's counts, without a call each) */
static PyObject *small_ints[MAX_TOKENS_PER_RECORD + 1];

/* Append n items to a list; -1 on error (nothing appended). A bucket's columns
 * keep their allocation from step to step (take_lists), so the items are
 * nearly always written in place, without a call per item. */
static inline int
extend_list(PyObject *list, PyObject *const *items, Py_ssize_t n)
{
    PyListObject *target = (PyListObject *)list;
    Py_ssize_t before = Py_SIZE(target);
    if (target->allocated - before >= n) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(items[i]);
            target->ob_item[before + i] = items[i];
        }
        Py_SET_SIZE(target, before + n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_Append(list, items[i]) < 0) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyList_SetSlice(list, before, PyList_GET_SIZE(list), NULL);
            PyErr_Restore(type, value, traceback);
            return -1;
        }
    }
    return 0;
}

/* Append the ROW_WIDTH ints of one row to a meta column; -1 on error (nothing appended). */
static int
append_meta(PyObject *meta, PyObject *const *values)
{
    return extend_list(meta, values, ROW_WIDTH);
}

/* Empty a list of at most MAX_TOKENS_PER_RECORD items, keeping its allocation
 * (a request's fragments: refilled by the next step's tokens). */
static void
clear_keeping_room(PyObject *list)
{
    PyListObject *target = (PyListObject *)list;
    Py_ssize_t n = Py_SIZE(target);
    if (n > MAX_TOKENS_PER_RECORD) {
        PyList_SetSlice(list, 0, n, NULL);
        return;
    }
    PyObject *items[MAX_TOKENS_PER_RECORD];
    memcpy(items, target->ob_item, (size_t)n * sizeof(PyObject *));
    Py_SET_SIZE(target, 0); /* before any decref: the list is consistent throughout */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(items[i]);
    }
}

/* take_lists(*lists) -> tuple of lists: each list's items moved into a new
 * list (hooks._Bucket.take: a step's columns handed to the sender without a
 * copy); each given list is left empty with room for as many items again. */
static PyObject *
take_lists(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (!PyList_CheckExact(args[i])) {
            PyErr_SetString(PyExc_TypeError, "take_lists(*lists): lists");
            return NULL;
        }
    }
    PyObject *taken = PyTuple_New(nargs);
    if (taken == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyListObject *source = (PyListObject *)args[i];
        PyListObject *moved = (PyListObject *)PyList_New(0);
        PyObject **room = NULL;
        Py_ssize_t size = Py_SIZE(source);
        if (moved != NULL && size > 0) {
            room = PyMem_New(PyObject *, (size_t)size);
            if (room == NULL) {
                PyErr_NoMemory();
                Py_CLEAR(moved);
            }
        }
        if (moved == NULL) {
            Py_DECREF(taken);
            return NULL;
        }
        if (size > 0) {
            moved->ob_item = source->ob_item;
            moved->allocated = source->allocated;
            Py_SET_SIZE(moved, size);
            source->ob_item = room;
            source->allocated = size;
            Py_SET_SIZE(source, 0);
        }
        PyTuple_SET_ITEM(taken, i, (PyObject *)moved);
    }
    return taken;
}

/* Move a request's fragments (at most MAX_TOKENS_PER_RECORD) to the end of the
 * run's column: the references change owner, no count changes; -1 on error
 * (nothing moved). The request's list keeps its room for the next step. */
static int
move_items(PyObject *from, PyObject *to)
{
    PyListObject *source = (PyListObject *)from, *target = (PyListObject *)to;
    Py_ssize_t n = Py_SIZE(source), before = Py_SIZE(target);
    if (target->allocated - before < n) {
        if (extend_list(to, source->ob_item, n) < 0) {
            return -1;
        }
        clear_keeping_room(from);
        return 0;
    }
    memcpy(target->ob_item + before, source->ob_item, (size_t)n * sizeof(PyObject *));
    Py_SET_SIZE(target, before + n);
    Py_SET_SIZE(source, 0);
    return 0;
}

/* One noted output's row (hooks._take_row): 1: the common row was taken or
 * `special` took the row; 0: not a RequestOutput, nothing to take; -1: error. */
static int
capture_output(CaptureState *self, PyObject *output)
{
    PyObject *completions = read_attr(output, str_outputs, &read_completions);
    if (completions == NULL) {
        PyErr_Clear(); /* an exception or a sentinel: not a RequestOutput */
        return 0;
    }
    if (!PyList_CheckExact(completions) || PyList_GET_SIZE(completions) == 0) {
        Py_DECREF(completions);
        return 0;
    }
    PyObject *completion = PyList_GET_ITEM(completions, 0);
    Py_INCREF(completion);
    Py_DECREF(completions);
    int status = -1;
    PyObject *index = NULL, *token_ids = NULL, *finish = NULL, *text = NULL, *stop = NULL;
    index = read_attr(completion, str_index, &read_index);
    token_ids = index ? read_attr(completion, str_token_ids, &read_token_ids) : NULL;
    finish = token_ids ? read_attr(completion, str_finish_reason, &read_completion_finish) : NULL;
    text = finish ? read_attr(completion, str_text, &read_text) : NULL;
    if (text == NULL) {
        goto done;
    }
    int overflow = 0;
    long long at;
    if (!small_int(index, &at)) { /* nearly always 0: read without a call */
        at = PyLong_Check(index) ? PyLong_AsLongLongAndOverflow(index, &overflow) : -1;
    }
    Py_ssize_t count = PyList_CheckExact(token_ids) ? PyList_GET_SIZE(token_ids) : -1;
    PyObject *fragments = self->fragments;
    /* The common row: not finished (only a finished step can have been trimmed
       after a stop string), every token decoded, and no fragment claims a
       token that decoded to "" (span_back): such a row needs lead_lens from the
       tokenizer (attribution.py), so it goes to `special` in Python. */
    int common = finish == Py_None && at == self->index && !overflow && count > 0 &&
                 count <= MAX_TOKENS_PER_RECORD && PyList_GET_SIZE(fragments) == count &&
                 PyUnicode_Check(text);
    long long pending = self->pending_empty;
    for (Py_ssize_t i = 0; common && i < count; i++) {
        PyObject *piece = PyList_GET_ITEM(fragments, i);
        if (!PyUnicode_Check(piece)) {
            common = 0;
        } else if (PyUnicode_GET_LENGTH(piece) == 0) {
            pending++;
        } else if (pending > 0) {
            common = 0; /* span_back > 0: the Python special row computes its lead_len */
        }
    }
    if (!common) {
        PyErr_Clear();
        stop = PyObject_GetAttr(completion, str_stop_reason);
        if (stop != NULL) {
            PyObject *done = PyObject_CallFunctionObjArgs(self->special, token_ids, finish, stop,
                                                          text, index, NULL);
            if (done != NULL) {
                Py_DECREF(done);
                status = 1;
            }
        }
        goto done;
    }
    PyObject *offset = PyLong_FromLongLong(self->offset);
    if (offset == NULL) {
        goto done;
    }
    PyObject *n = small_ints[count], *zero = small_ints[0]; /* count <= MAX_TOKENS_PER_RECORD */
    /* Columns in the order ids, fragments, text, meta, each undone on failure, so
       that the run's columns stay aligned. The ids are copied: outputs are
       merged later. */
    PyObject *values[ROW_WIDTH] = {self->stream, zero, zero, offset, n, n, zero};
    Py_ssize_t ids_before = PyList_GET_SIZE(self->ids);
    Py_ssize_t fragments_before = PyList_GET_SIZE(self->all_fragments);
    Py_ssize_t texts_before = PyList_GET_SIZE(self->texts);
    Py_ssize_t meta_before = PyList_GET_SIZE(self->meta);
    int failed = extend_list(self->ids, PySequence_Fast_ITEMS(token_ids), count) < 0 ||
                 extend_list(self->texts, &text, 1) < 0 || append_meta(self->meta, values) < 0 ||
                 move_items(fragments, self->all_fragments) < 0;
    Py_DECREF(offset);
    if (failed) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyList_SetSlice(self->ids, ids_before, PyList_GET_SIZE(self->ids), NULL);
        PyList_SetSlice(self->all_fragments, fragments_before,
                        PyList_GET_SIZE(self->all_fragments), NULL);
        PyList_SetSlice(self->texts, texts_before, PyList_GET_SIZE(self->texts), NULL);
        PyList_SetSlice(self->meta, meta_before, PyList_GET_SIZE(self->meta), NULL);
        PyErr_Restore(type, value, traceback);
        goto done;
    }
    self->pending_empty = pending;
    self->offset += count;
    status = 1;
done:
    Py_XDECREF(stop);
    Py_XDECREF(text);
    Py_XDECREF(finish);
    Py_XDECREF(token_ids);
    Py_XDECREF(index);
    Py_DECREF(completion);
    return status;
}

/* The error of a noted output's row goes to the capture's failed(error); nothing
 * is raised from here (hooks._take_row does the same). */
static void
capture_failed(CaptureState *self)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *done = PyObject_CallOneArg(self->failed, value ? value : Py_None);
    Py_XDECREF(done);
    PyErr_Clear();
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
}

static PyTypeObject CaptureStateType;

static ALWAYS_INLINE int
is_capture(PyObject *obj)
{
    return Py_IS_TYPE(obj, &CaptureStateType);
}

/* take_rows(seen): the rows of a step's noted outputs (hooks._take_rows).
 *
 * `seen` holds (capture, output) pairs in the order vLLM put the outputs; it is
 * emptied first (keeping its room), so whatever the callbacks do cannot change
 * the items taken here. A capture not followed by an output (its put could not
 * note it) or no longer active is skipped; each row's failure goes to its
 * capture's failed(error). Raises only when `seen` is not a list. */
static PyObject *
take_rows(PyObject *Py_UNUSED(module), PyObject *seen)
{
    if (!PyList_CheckExact(seen)) {
        PyErr_SetString(PyExc_TypeError, "take_rows(seen): a list");
        return NULL;
    }
    PyListObject *list = (PyListObject *)seen;
    Py_ssize_t n = Py_SIZE(list);
    PyObject *stack[512];
    PyObject **items = stack;
    if (n > (Py_ssize_t)(sizeof(stack) / sizeof(stack[0]))) {
        items = PyMem_New(PyObject *, (size_t)n);
        if (items == NULL) {
            return PyErr_NoMemory();
        }
    }
    memcpy(items, list->ob_item, (size_t)n * sizeof(PyObject *));
    Py_SET_SIZE(list, 0); /* the references are ours now */
    for (Py_ssize_t i = 0; i < n;) {
        PyObject *item = items[i++];
        if (!is_capture(item)) {
            continue;
        }
        CaptureState *capture = (CaptureState *)item;
        if (i >= n || is_capture(items[i])) {
            continue;
        }
        PyObject *output = items[i++];
        if (capture->active && capture_output(capture, output) < 0) {
            capture_failed(capture);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(items[i]);
    }
    if (items != stack) {
        PyMem_Free(items);
    }
    Py_RETURN_NONE;
}

/* put(output), as vLLM calls it (hooks._QueueCapture.put): note (self, output) in
 * `seen`, then the real queue's put (its result and errors go to vLLM). */
static PyObject *
capture_put(CaptureState *self, PyObject *output)
{
    PyListObject *seen = (PyListObject *)self->seen;
    Py_ssize_t size = Py_SIZE(seen);
    if (seen->allocated - size >= 2) {
        seen->ob_item[size] = Py_NewRef((PyObject *)self);
        seen->ob_item[size + 1] = Py_NewRef(output);
        Py_SET_SIZE(seen, size + 2);
    } else if (PyList_Append(self->seen, (PyObject *)self) < 0 ||
               PyList_Append(self->seen, output) < 0) {
        capture_failed(self);
    }
    return PyObject_CallOneArg(self->put, output);
}

static PyMethodDef capture_methods[] = {
    {"put", (PyCFunction)capture_put, METH_O,
     "put(output): note (self, output) in seen, then the real queue's put(output)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *
capture_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"queue", "fragments", "bucket", "stream", "index", "special",
                            "failed", "seen", NULL};
    PyObject *queue, *fragments, *bucket, *stream, *special, *failed, *seen;
    long long index;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO!LOOO!:CaptureState", names, &queue,
                                     &PyList_Type, &fragments, &bucket, &PyLong_Type, &stream,
                                     &index, &special, &failed, &PyList_Type, &seen)) {
        return NULL;
    }
    PyObject *put = PyObject_GetAttr(queue, str_put);
    if (put == NULL) {
        return NULL;
    }
    PyObject *meta = PyObject_GetAttrString(bucket, "meta");
    PyObject *ids = PyObject_GetAttrString(bucket, "ids");
    PyObject *texts = PyObject_GetAttrString(bucket, "extra");
    PyObject *all_fragments = PyObject_GetAttrString(bucket, "fragments");
    if (meta == NULL || ids == NULL || texts == NULL || all_fragments == NULL ||
        !PyList_Check(meta) || !PyList_Check(ids) || !PyList_Check(texts) ||
        !PyList_Check(all_fragments)) {
        Py_XDECREF(meta);
        Py_XDECREF(ids);
        Py_XDECREF(texts);
        Py_XDECREF(all_fragments);
        Py_DECREF(put);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError,
                            "CaptureState: bucket.meta/ids/extra/fragments must be lists");
        }
        return NULL;
    }
    CaptureState *self = (CaptureState *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(meta);
        Py_DECREF(ids);
        Py_DECREF(texts);
        Py_DECREF(all_fragments);
        Py_DECREF(put);
        return NULL;
    }
    self->queue = Py_NewRef(queue);
    self->put = put;
    self->seen = Py_NewRef(seen);
    self->fragments = Py_NewRef(fragments);
    self->meta = meta;
    self->ids = ids;
    self->texts = texts;
    self->all_fragments = all_fragments;
    self->stream = Py_NewRef(stream);
    self->special = Py_NewRef(special);
    self->failed = Py_NewRef(failed);
    self->index = index;
    self->active = 1;
    return (PyObject *)self;
}

OBJECT_FIELDS_GC(capture, CaptureState, queue, failed)

static PyMemberDef capture_members[] = {
    {"queue", T_OBJECT, offsetof(CaptureState, queue), READONLY, "the real output queue"},
    {"offset", T_LONGLONG, offsetof(CaptureState, offset), 0, "the request's next token offset"},
    {"pending_empty", T_LONGLONG, offsetof(CaptureState, pending_empty), 0,
     "tokens that returned \"\" and no fragment has claimed yet"},
    {"active", T_BOOL, offsetof(CaptureState, active), 0,
     "False once the request's telemetry ended: its noted outputs are skipped"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CaptureStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "parallelhue_vllm._speedups.CaptureState",
    .tp_doc = "CaptureState(queue, fragments, bucket, stream, index, special, failed, seen): "
              "see hooks._QueueCapture.",
    .tp_basicsize = sizeof(CaptureState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = capture_new,
    .tp_traverse = (traverseproc)capture_traverse,
    .tp_clear = (inquiry)capture_clear,
    .tp_dealloc = (destructor)capture_dealloc,
    .tp_members = capture_members,
    .tp_methods = capture_methods,
};

/* --------------------------------------------------------- SchedRequest */
/* hooks._SchedRequest with C fields, so that scheduler_rows reads them directly. */
typedef struct {
    PyObject_HEAD
    PyObject *run;
    PyObject *stream;  /* int */
    PyObject *meta;    /* the run's bucket columns */
    PyObject *ids;
    PyObject *extra;
    long long offset;
} SchedRequest;

static PyObject *
sched_request_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"run", "stream", "bucket", NULL};
    PyObject *run, *stream, *bucket;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO!O:SchedRequest", names, &run,
                                     &PyLong_Type, &stream, &bucket)) {
        return NULL;
    }
    PyObject *meta = PyObject_GetAttrString(bucket, "meta");
    PyObject *ids = meta ? PyObject_GetAttrString(bucket, "ids") : NULL;
    PyObject *extra = ids ? PyObject_GetAttrString(bucket, "extra") : NULL;
    if (extra == NULL || !PyList_Check(meta) || !PyList_Check(ids) || !PyList_Check(extra)) {
        Py_XDECREF(meta);
        Py_XDECREF(ids);
        Py_XDECREF(extra);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "SchedRequest: bucket.meta/ids/extra must be lists");
        }
        return NULL;
    }
    SchedRequest *self = (SchedRequest *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(meta);
        Py_DECREF(ids);
        Py_DECREF(extra);
        return NULL;
    }
    Py_INCREF(run);
    Py_INCREF(stream);
    self->run = run;
    self->stream = stream;
    self->meta = meta;
    self->ids = ids;
    self->extra = extra;
    return (PyObject *)self;
}

OBJECT_FIELDS_GC(sched_request, SchedRequest, run, extra)

static PyMemberDef sched_request_members[] = {
    {"run", T_OBJECT, offsetof(SchedRequest, run), READONLY, "the run id"},
    {"stream", T_OBJECT, offsetof(SchedRequest, stream), READONLY, "the stream index"},
    {"meta", T_OBJECT, offsetof(SchedRequest, meta), READONLY, "the run's meta column"},
    {"ids", T_OBJECT, offsetof(SchedRequest, ids), READONLY, "the run's token ids column"},
    {"extra", T_OBJECT, offsetof(SchedRequest, extra), READONLY, "the run's roles column"},
    {"offset", T_LONGLONG, offsetof(SchedRequest, offset), 0, "the request's next offset"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SchedRequestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "parallelhue_vllm._speedups.SchedRequest",
    .tp_doc = "SchedRequest(run, stream, bucket): see hooks._SchedRequest.",
    .tp_basicsize = sizeof(SchedRequest),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = sched_request_new,
    .tp_traverse = (traverseproc)sched_request_traverse,
    .tp_clear = (inquiry)sched_request_clear,
    .tp_dealloc = (destructor)sched_request_dealloc,
    .tp_members = sched_request_members,
};

/* Whether a draft list holds a -1 placeholder (ints only; anything else: -1 = unknown). */
static int
has_placeholder(PyObject *drafts)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(drafts); i++) {
        PyObject *item = PyList_GET_ITEM(drafts, i);
        long long small;
        if (small_int(item, &small)) {
            if (small == -1) {
                return 1;
            }
            continue;
        }
        if (!PyLong_CheckExact(item)) {
            return -1;
        }
        int overflow = 0;
        if (PyLong_AsLongAndOverflow(item, &overflow) == -1 && !overflow) {
            return 1;
        }
    }
    return 0;
}


/* sampled_lengths(sampled) -> list[int]: len() of each of a step's sampled token
 * lists (hooks.SchedulerTelemetry.before), before the stop checks trim them. */
static PyObject *
sampled_lengths(PyObject *Py_UNUSED(module), PyObject *sampled)
{
    if (!PyList_Check(sampled)) {
        PyErr_SetString(PyExc_TypeError, "sampled_lengths(sampled): a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(sampled);
    PyObject *lengths = PyList_New(n);
    if (lengths == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *tokens = PyList_GET_ITEM(sampled, i);
        Py_ssize_t size = PyList_CheckExact(tokens) ? PyList_GET_SIZE(tokens) : PyObject_Size(tokens);
        PyObject *value = size < 0 ? NULL : PyLong_FromSsize_t(size);
        if (value == NULL) {
            Py_DECREF(lengths);
            return NULL;
        }
        PyList_SET_ITEM(lengths, i, value);
    }
    return lengths;
}

/* has_empty(fragments) -> bool: whether any item is an empty str (`"" in fragments`
 * without a rich comparison per item: the text hook's per-step test for fragments
 * that decoded to "", hooks.FrontendTelemetry.flush_rows). */
static PyObject *
has_empty(PyObject *Py_UNUSED(module), PyObject *fragments)
{
    if (!PyList_Check(fragments)) {
        PyErr_SetString(PyExc_TypeError, "has_empty(fragments): a list");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fragments); i++) {
        PyObject *item = PyList_GET_ITEM(fragments, i);
        if (PyUnicode_Check(item)) {
            if (PyUnicode_GET_LENGTH(item) == 0) {
                Py_RETURN_TRUE;
            }
            continue;
        }
        /* not a str (never one the hooks append): the comparison `in` makes */
        Py_INCREF(item);
        int equal = PyObject_RichCompareBool(item, str_empty, Py_EQ);
        Py_DECREF(item);
        if (equal < 0) {
            return NULL;
        }
        if (equal) {
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

/* ------------------------------------------------------ scheduler_rows */
static PyObject *str_request_id, *str_new_token_ids;

/* scheduler_rows(results, requests, spec_tokens, role_table, plain_role, check_padding,
 *                special)
 *
 * The EngineCore hook's loop over one step's outputs (hooks.SchedulerTelemetry.after):
 * for each output of a request in `requests`, the common row (not finished,
 * drafts without placeholders, counts that make sense) is appended to the
 * request's `rows` and its `offset` advanced; every other one is handed to
 * special(state, output), in output order.
 */
static PyObject *
scheduler_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyList_Check(args[3]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "scheduler_rows(results, requests, spec_tokens, role_table, plain_role, "
                        "check_padding, special)");
        return NULL;
    }
    PyObject *requests = args[1], *spec_tokens = args[2], *role_table = args[3];
    PyObject *plain_role = args[4], *special = args[6];
    int check_padding = PyObject_IsTrue(args[5]);
    if (check_padding < 0) {
        return NULL;
    }
    PyObject *results = PyObject_GetIter(args[0]);
    if (results == NULL) {
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    PyObject *engine_outputs;
    while ((engine_outputs = PyIter_Next(results)) != NULL) {
        PyObject *outputs = read_attr(engine_outputs, str_outputs, &read_outputs);
        Py_DECREF(engine_outputs);
        if (outputs == NULL || !PyList_Check(outputs)) {
            if (outputs != NULL) {
                PyErr_SetString(PyExc_TypeError, "EngineCoreOutputs.outputs is not a list");
            }
            Py_XDECREF(outputs);
            goto fail;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); i++) {
            PyObject *output = PyList_GET_ITEM(outputs, i);
            Py_INCREF(output);
            PyObject *rid = read_attr(output, str_request_id, &read_request_id);
            PyObject *state = rid ? PyDict_GetItemWithError(requests, rid) : NULL;
            if (state == NULL) {
                Py_XDECREF(rid);
                Py_DECREF(output);
                if (PyErr_Occurred()) {
                    Py_DECREF(outputs);
                    goto fail;
                }
                continue;
            }
            Py_INCREF(state);
            PyObject *tokens = read_attr(output, str_new_token_ids, &read_new_token_ids);
            PyObject *reason =
                tokens ? read_attr(output, str_finish_reason, &read_finish_reason) : NULL;
            PyObject *drafts = reason ? PyDict_GetItemWithError(spec_tokens, rid) : NULL;
            Py_DECREF(rid);
            int slow = 1;
            Py_ssize_t count = 0, scheduled = 0;
            PyObject *roles = NULL;
            if (reason != NULL && !PyErr_Occurred() && PyList_CheckExact(tokens)) {
                count = PyList_GET_SIZE(tokens);
                if (drafts != NULL && PyList_CheckExact(drafts) && PyList_GET_SIZE(drafts) > 0) {
                    scheduled = PyList_GET_SIZE(drafts);
                    if (scheduled < PyList_GET_SIZE(role_table)) {
                        PyObject *by_count = PyList_GET_ITEM(role_table, scheduled);
                        if (PyList_Check(by_count) && count < PyList_GET_SIZE(by_count)) {
                            roles = PyList_GET_ITEM(by_count, count);
                        }
                    }
                    slow = roles == NULL || roles == Py_None;
                    if (!slow && check_padding) {
                        slow = has_placeholder(drafts) != 0; /* unknown contents: Python */
                    }
                } else if (drafts == NULL || PyList_Check(drafts)) {
                    roles = plain_role;
                    slow = count != 1;
                }
            }
            if (tokens == NULL || reason == NULL || slow < 0 || PyErr_Occurred()) {
                Py_XDECREF(tokens);
                Py_XDECREF(reason);
                Py_DECREF(state);
                Py_DECREF(output);
                Py_DECREF(outputs);
                goto fail;
            }
            if (slow || reason != Py_None) {
                Py_DECREF(tokens);
                Py_DECREF(reason);
                PyObject *done = PyObject_CallFunctionObjArgs(special, state, output, NULL);
                Py_DECREF(state);
                Py_DECREF(output);
                if (done == NULL) {
                    Py_DECREF(outputs);
                    goto fail;
                }
                Py_DECREF(done);
                continue;
            }
            Py_DECREF(reason);
            int ok = 0;
            if (Py_TYPE(state) != &SchedRequestType) {
                PyErr_SetString(PyExc_TypeError, "scheduler_rows: requests must be SchedRequest");
            } else {
                SchedRequest *request = (SchedRequest *)state;
                PyObject *offset = PyLong_FromLongLong(request->offset);
                /* counts up to MAX_TOKENS_PER_RECORD: the table's (new references) */
                PyObject *n = offset == NULL ? NULL
                              : count <= MAX_TOKENS_PER_RECORD
                                  ? Py_NewRef(small_ints[count])
                                  : PyLong_FromSsize_t(count);
                PyObject *s = n == NULL ? NULL
                              : scheduled <= MAX_TOKENS_PER_RECORD
                                  ? Py_NewRef(small_ints[scheduled])
                                  : PyLong_FromSsize_t(scheduled);
                if (s != NULL) {
                    PyObject *values[ROW_WIDTH] = {request->stream, zero, zero, offset, n, s, zero};
                    PyObject *ids = request->ids, *extra = request->extra;
                    Py_ssize_t ids_before = PyList_GET_SIZE(ids);
                    Py_ssize_t extra_before = PyList_GET_SIZE(extra);
                    if (extend_list(ids, PySequence_Fast_ITEMS(tokens), count) == 0) {
                        if (extend_list(extra, &roles, 1) == 0) {
                            if (append_meta(request->meta, values) == 0) {
                                request->offset += count;
                                ok = 1;
                            } else {
                                PyList_SetSlice(extra, extra_before, PyList_GET_SIZE(extra), NULL);
                                PyList_SetSlice(ids, ids_before, PyList_GET_SIZE(ids), NULL);
                            }
                        } else {
                            PyList_SetSlice(ids, ids_before, PyList_GET_SIZE(ids), NULL);
                        }
                    }
                }
                Py_XDECREF(s);
                Py_XDECREF(n);
                Py_XDECREF(offset);
            }
            Py_DECREF(tokens);
            Py_DECREF(state);
            Py_DECREF(output);
            if (!ok) {
                Py_DECREF(outputs);
                goto fail;
            }
        }
        Py_DECREF(outputs);
    }
    Py_DECREF(results);
    Py_DECREF(zero);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
fail:
    Py_DECREF(results);
    Py_DECREF(zero);
    return NULL;
}

/* -------------------------------------------------------------- module */
static PyMethodDef methods[] = {
    {"scheduler_rows", (PyCFunction)(void (*)(void))scheduler_rows, METH_FASTCALL,
     "The EngineCore hook's loop over a step's outputs (hooks.SchedulerTelemetry.after)."},
    {"take_lists", (PyCFunction)(void (*)(void))take_lists, METH_FASTCALL,
     "Each list's items moved into a new list; the lists left empty with their room."},
    {"take_rows", (PyCFunction)take_rows, METH_O,
     "The rows of a step's noted (capture, output) pairs; the list left empty."},
    {"has_empty", (PyCFunction)has_empty, METH_O,
     "Whether a list holds an empty str (`\"\" in fragments`, without a comparison per item)."},
    {"sampled_lengths", (PyCFunction)sampled_lengths, METH_O,
     "len() of each of a step's sampled token lists (hooks.SchedulerTelemetry.before)."},
    {"encode_provenance_step", (PyCFunction)(void (*)(void))encode_provenance_step,
     METH_FASTCALL, "The bytes of each provenance record of a step (wire.py)."},
    {"encode_text_step", (PyCFunction)(void (*)(void))encode_text_step, METH_FASTCALL,
     "The bytes of each text record of a step (wire.py)."},
    {"encode_provenance_body", (PyCFunction)(void (*)(void))encode_provenance_body,
     METH_FASTCALL, "The provenance records of a step, joined (a frame body)."},
    {"encode_text_body", (PyCFunction)(void (*)(void))encode_text_body, METH_FASTCALL,
     "The text records of a step, joined (a frame body)."},
    {"encode_provenance_frame", (PyCFunction)(void (*)(void))encode_provenance_frame,
     METH_FASTCALL, "A step's provenance frame, or None when it is not one frame."},
    {"encode_text_frame", (PyCFunction)(void (*)(void))encode_text_frame, METH_FASTCALL,
     "A step's text frame, or None when it is not one frame."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "Optional C versions of the ParallelHue plugin's hottest code.", -1, methods,
    NULL, NULL, NULL, NULL,
};

static int
intern_names(void)
{
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&str_outputs, "outputs"},       {&str_text, "text"},
        {&str_request_id, "request_id"}, {&str_new_token_ids, "new_token_ids"},
        {&str_finish_reason, "finish_reason"},
        {&str_step, "step"},             {&str_put, "put"},
        {&str_empty, ""},                {&str_index, "index"},
        {&str_token_ids, "token_ids"},   {&str_stop_reason, "stop_reason"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL) {
            return -1;
        }
    }
    for (long i = 0; i <= MAX_TOKENS_PER_RECORD; i++) {
        small_ints[i] = PyLong_FromLong(i);
        if (small_ints[i] == NULL) {
            return -1;
        }
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (intern_names() < 0) {
        return NULL;
    }
    if (PyType_Ready(&StreamRecorderType) < 0 || PyType_Ready(&CaptureStateType) < 0 ||
        PyType_Ready(&SchedRequestType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) {
        return NULL;
    }
    PyTypeObject *types[] = {&StreamRecorderType, &SchedRequestType, &CaptureStateType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyModule_AddType(module, types[i]) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    /* accelerator.py uses this module only when ABI is the one it was written for. */
    if (PyModule_AddIntConstant(module, "ABI", SPEEDUPS_ABI) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
