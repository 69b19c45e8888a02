/* The API-server side (hooks.FrontendTelemetry's stand-ins and its step loop).
 *
 * StreamRecorder(stream, fragments, recover) and CaptureState(...) stand in for a
 * detokenizer's decode stream and a request's output queue (hooks._StreamRecorder,
 * hooks._QueueCapture: put only notes the output); take_rows(seen) takes the
 * step's rows of the noted outputs in one loop (hooks._take_rows); has_empty is
 * the per-step test for fragments that decoded to "".
 */
#include "layout.h"

/* The capture's reads: RequestOutput.outputs and four CompletionOutput fields. */
static SlotReader read_completions, read_index, read_token_ids, read_completion_finish;
static SlotReader read_text;

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

PyTypeObject StreamRecorderType = {
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
PyObject *
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

PyTypeObject CaptureStateType = {
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

/* has_empty(fragments) -> bool: whether any item is an empty str (`"" in fragments`
 * without a rich comparison per item: the text hook's per-step test for fragments
 * that decoded to "", hooks.FrontendTelemetry.flush_rows). */
PyObject *
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

