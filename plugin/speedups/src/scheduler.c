/* The EngineCore side (hooks.SchedulerTelemetry): SchedRequest, the lengths of a
 * step's sampled lists before the stop checks trim them, and scheduler_rows, the
 * loop over a step's outputs (hooks.SchedulerTelemetry.after / _python_rows).
 */
#include "layout.h"

/* The loop's reads: EngineCoreOutputs.outputs and three EngineCoreOutput fields. */
static SlotReader read_outputs, read_request_id, read_new_token_ids, read_finish_reason;

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

PyTypeObject SchedRequestType = {
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
PyObject *
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

/* The step's tables scheduler_rows reads (its arguments). */
typedef struct {
    PyObject *spec_tokens; /* request id -> scheduled drafts */
    PyObject *role_table;  /* [drafts][generated] -> roles bytes, or None */
    PyObject *plain_role;  /* the roles of a step without drafts */
    PyObject *special;     /* special(state, output) */
    PyObject *zero;
    int check_padding;     /* drafts may hold -1 placeholders */
} Step;

/* The roles of the common row of an output with `count` tokens and these drafts
 * (borrowed), or NULL when the row is not the common one (then `special` takes
 * it); *scheduled: the drafts' count. -1 with an error. */
static ALWAYS_INLINE int
common_roles(const Step *step, PyObject *drafts, Py_ssize_t count, Py_ssize_t *scheduled,
             PyObject **roles)
{
    *roles = NULL;
    *scheduled = 0;
    if (drafts != NULL && PyList_CheckExact(drafts) && PyList_GET_SIZE(drafts) > 0) {
        *scheduled = PyList_GET_SIZE(drafts);
        if (*scheduled < PyList_GET_SIZE(step->role_table)) {
            PyObject *by_count = PyList_GET_ITEM(step->role_table, *scheduled);
            if (PyList_Check(by_count) && count < PyList_GET_SIZE(by_count)) {
                *roles = PyList_GET_ITEM(by_count, count);
            }
        }
        if (*roles == Py_None) {
            *roles = NULL;
        }
        if (*roles != NULL && step->check_padding) {
            int padded = has_placeholder(drafts); /* unknown contents (-1): Python */
            if (padded != 0) {
                *roles = NULL;
            }
        }
        return 0;
    }
    if ((drafts == NULL || PyList_Check(drafts)) && count == 1) {
        *roles = step->plain_role;
    }
    return 0;
}

/* Append the common row to the request's columns and advance its offset; -1 on error
 * (nothing appended: the run's columns stay aligned). */
static ALWAYS_INLINE int
append_row(SchedRequest *request, PyObject *tokens, Py_ssize_t count, Py_ssize_t scheduled,
           PyObject *roles, PyObject *zero)
{
    int ok = -1;
    PyObject *offset = PyLong_FromLongLong(request->offset);
    /* counts up to MAX_TOKENS_PER_RECORD: the table's (new references) */
    PyObject *n = offset == NULL                   ? NULL
                  : count <= MAX_TOKENS_PER_RECORD ? Py_NewRef(small_ints[count])
                                                   : PyLong_FromSsize_t(count);
    PyObject *s = n == NULL                            ? NULL
                  : scheduled <= MAX_TOKENS_PER_RECORD ? Py_NewRef(small_ints[scheduled])
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
                    ok = 0;
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
    return ok;
}

/* One output of a request of ours (`state`): its common row appended, or the output
 * handed to special(state, output); -1 with an error. */
static ALWAYS_INLINE int
output_row(const Step *step, PyObject *state, PyObject *output, PyObject *rid)
{
    PyObject *tokens = read_attr(output, str_new_token_ids, &read_new_token_ids);
    PyObject *reason = tokens ? read_attr(output, str_finish_reason, &read_finish_reason) : NULL;
    PyObject *drafts = reason ? PyDict_GetItemWithError(step->spec_tokens, rid) : NULL;
    int status = -1;
    Py_ssize_t count = 0, scheduled = 0;
    PyObject *roles = NULL;
    if (reason == NULL || PyErr_Occurred()) {
        goto done;
    }
    if (PyList_CheckExact(tokens)) {
        count = PyList_GET_SIZE(tokens);
        if (common_roles(step, drafts, count, &scheduled, &roles) < 0) {
            goto done;
        }
    }
    if (roles == NULL || reason != Py_None) {
        PyObject *done = PyObject_CallFunctionObjArgs(step->special, state, output, NULL);
        Py_XDECREF(done);
        status = done == NULL ? -1 : 0;
        goto done;
    }
    if (Py_TYPE(state) != &SchedRequestType) {
        PyErr_SetString(PyExc_TypeError, "scheduler_rows: requests must be SchedRequest");
        goto done;
    }
    status = append_row((SchedRequest *)state, tokens, count, scheduled, roles, step->zero);
done:
    Py_XDECREF(tokens);
    Py_XDECREF(reason);
    return status;
}

/* The rows of one EngineCoreOutputs' outputs; -1 with an error. */
static int
outputs_rows(const Step *step, PyObject *requests, PyObject *engine_outputs)
{
    PyObject *outputs = read_attr(engine_outputs, str_outputs, &read_outputs);
    if (outputs == NULL || !PyList_Check(outputs)) {
        if (outputs != NULL) {
            PyErr_SetString(PyExc_TypeError, "EngineCoreOutputs.outputs is not a list");
        }
        Py_XDECREF(outputs);
        return -1;
    }
    int status = 0;
    for (Py_ssize_t i = 0; status == 0 && i < PyList_GET_SIZE(outputs); i++) {
        PyObject *output = Py_NewRef(PyList_GET_ITEM(outputs, i));
        PyObject *rid = read_attr(output, str_request_id, &read_request_id);
        PyObject *state = rid ? PyDict_GetItemWithError(requests, rid) : NULL;
        if (state != NULL) {
            Py_INCREF(state);
            status = output_row(step, state, output, rid);
            Py_DECREF(state);
        } else if (rid == NULL || PyErr_Occurred()) {
            status = -1;
        }
        Py_XDECREF(rid);
        Py_DECREF(output);
    }
    Py_DECREF(outputs);
    return status;
}

/* scheduler_rows(results, requests, spec_tokens, role_table, plain_role, check_padding,
 *                special)
 *
 * The EngineCore hook's loop over one step's outputs (hooks.SchedulerTelemetry.after):
 * for each output of a request in `requests`, the common row (not finished,
 * drafts without placeholders, counts that make sense) is appended to the
 * request's `rows` and its `offset` advanced; every other one is handed to
 * special(state, output), in output order.
 */
PyObject *
scheduler_rows(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyList_Check(args[3]) || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "scheduler_rows(results, requests, spec_tokens, role_table, plain_role, "
                        "check_padding, special)");
        return NULL;
    }
    Step step = {args[2], args[3], args[4], args[6], small_ints[0], PyObject_IsTrue(args[5])};
    if (step.check_padding < 0) {
        return NULL;
    }
    PyObject *results = PyObject_GetIter(args[0]);
    if (results == NULL) {
        return NULL;
    }
    PyObject *engine_outputs;
    int status = 0;
    while (status == 0 && (engine_outputs = PyIter_Next(results)) != NULL) {
        status = outputs_rows(&step, args[1], engine_outputs);
        Py_DECREF(engine_outputs);
    }
    Py_DECREF(results);
    if (status < 0 || PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}
