/* The sender threads' step encoders (wire.py's, which is the reference).
 *
 * encode_provenance_step(meta, ids, roles), encode_text_step(meta, ids, texts,
 * fragments, span_backs[, leads]): a step's record bytes, as wire.py's functions
 * of the same names; *_body (same arguments): those records joined in one bytes
 * object, the frame body the emitter's sender thread sends
 * (emitter.encode_chunks); *_frame (the header fields first): the whole frame of
 * such a body, wire.encode_joined_frame's bytes, written at once
 * (emitter.Emitter.process), or None when it is not one frame. The text
 * encoder writes protocol 3's entry (lead_len: a fragment's split, or an empty
 * fragment's give count); tests/test_wire_speedups.py compares the bytes on
 * random steps.
 */
#include "layout.h"

#define PROVENANCE_HEADER 14
#define TEXT_HEADER 16
#define TEXT_ENTRY 9
/* The text flags wire.py defines (finished 1, text truncated 2, tokens trimmed 4). */
#define TEXT_FLAG_BITS 7
#define FLAG_BITS_ONLY 0

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

/* The list a step's dict (span_backs or leads) holds for record `r`, in *out (NULL:
 * none): -1 with ValueError unless it is a list of `count` items (at least `count`
 * unless `exact`). A NULL or empty dict holds none. */
static ALWAYS_INLINE int
record_list(PyObject *of, Py_ssize_t r, Py_ssize_t count, int exact, const char *what,
            PyObject **out)
{
    *out = NULL;
    if (of == NULL || !PyDict_GET_SIZE(of)) {
        return 0;
    }
    PyObject *key = PyLong_FromSsize_t(r);
    if (key == NULL) {
        return -1;
    }
    PyObject *found = PyDict_GetItemWithError(of, key);
    Py_DECREF(key);
    if (found == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_ssize_t size = PyList_Check(found) ? PyList_GET_SIZE(found) : -1;
    if (size < 0 || size < count || (exact && size != count)) {
        PyErr_Format(PyExc_ValueError, "text record: %s for %zd tokens needed", what, count);
        return -1;
    }
    *out = found;
    return 0;
}

/* A text record's `count` entries (id, frag_len, span_back, lead_len) from `entry`
 * on, each fragment's bytes after them; returns where the HTTP text goes, or NULL
 * with the error of a field out of range. */
static ALWAYS_INLINE unsigned char *
write_entries(unsigned char *entry, Py_ssize_t count, Py_ssize_t used, PyObject *ids,
              Py_ssize_t first_id, PyObject *backs, PyObject *leads,
              const char *const *piece_bytes, const Py_ssize_t *piece_lengths)
{
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
            return NULL;
        }
        copy_short(data, bytes, length);
        data += length;
        put32(entry, (unsigned long)id);
        put16(entry + 4, (unsigned long)length);
        entry[6] = (unsigned char)back;
        put16(entry + 7, (unsigned long)lead);
    }
    return data;
}

/* The UTF-8 of `used` fragments from `first` on, into piece_bytes / piece_lengths;
 * returns their total length, or -1 with the error of one that is no str or too long. */
static ALWAYS_INLINE Py_ssize_t
fragment_bytes(PyObject *fragments, Py_ssize_t first, Py_ssize_t used,
               const char **piece_bytes, Py_ssize_t *piece_lengths)
{
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < used; i++) {
        PyObject *piece = PyList_GET_ITEM(fragments, first + i);
        Py_ssize_t length;
        if (!PyUnicode_Check(piece)) {
            PyErr_SetString(PyExc_TypeError, "text step: a fragment is not a str");
            return -1;
        }
        if ((piece_bytes[i] = utf8_of(piece, &length)) == NULL) {
            return -1;
        }
        piece_lengths[i] = length;
        if (length > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "text record field out of range: frag_len");
            return -1;
        }
        size += length;
    }
    return size;
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
        /* span_backs and lead_lens of this record, for every token (NULL: none) */
        PyObject *backs, *leads;
        if (record_list(span_backs, r, count, 0, "span_backs", &backs) < 0 ||
            record_list(leads_of, r, count, 1, "lead_lens", &leads) < 0) {
            goto fail;
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
        Py_ssize_t pieces_size = fragment_bytes(fragments, first_fragment, used, piece_bytes,
                                                piece_lengths);
        if (pieces_size < 0) {
            goto fail;
        }
        size += pieces_size;
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
        unsigned char *data = write_entries(p + TEXT_HEADER, count, used, ids, first_id, backs,
                                            leads, piece_bytes, piece_lengths);
        if (data == NULL) {
            goto fail;
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

/* The three entry points of each record kind: *_step (a list of record bytes),
 * *_body (the records joined), *_frame (the header fields first: the whole frame, or
 * None when the header fields or the records do not fit one frame). */
#define ENCODER_TRIPLET(kind)                                                            \
    PyObject *encode_##kind##_step(PyObject *Py_UNUSED(module), PyObject *const *args,   \
                                   Py_ssize_t nargs)                                     \
    {                                                                                    \
        return encode_##kind(args, nargs, RECORDS, NULL);                                \
    }                                                                                    \
    PyObject *encode_##kind##_body(PyObject *Py_UNUSED(module), PyObject *const *args,   \
                                   Py_ssize_t nargs)                                     \
    {                                                                                    \
        return encode_##kind(args, nargs, BODY, NULL);                                   \
    }                                                                                    \
    PyObject *encode_##kind##_frame(PyObject *Py_UNUSED(module), PyObject *const *args,  \
                                    Py_ssize_t nargs)                                    \
    {                                                                                    \
        FrameHead head;                                                                  \
        if (nargs < 6 || !frame_head(args, &head)) {                                     \
            Py_RETURN_NONE;                                                              \
        }                                                                                \
        return encode_##kind(args + 6, nargs - 6, FRAME, &head);                         \
    }

ENCODER_TRIPLET(provenance)
ENCODER_TRIPLET(text)
