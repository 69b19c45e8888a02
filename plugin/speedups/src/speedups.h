/* parallelhue_vllm._speedups: what its files share (constants, inline helpers, names).
 *
 * The accelerator, by process and concern (each file says what it mirrors in
 * the Python code, which is the reference: tests check that both produce the
 * same rows and bytes and refuse the same inputs):
 * - scheduler.c: the EngineCore side (hooks.SchedulerTelemetry's loop);
 * - frontend.c: the API-server side (the stand-ins for a detokenizer's decode
 *   stream and a request's output queue, the step's text rows);
 * - buckets.c: a step's columns handed to the sender (both sides);
 * - encode.c: the sender threads' step and frame encoders (wire.py's);
 * - layout.h / layout.c: attribute reads that know where CPython keeps them,
 *   the only code that depends on CPython's internal layout, behind its
 *   version guards;
 * - module.c: the module, its interned names and its ABI number.
 */
#ifndef PARALLELHUE_SPEEDUPS_H
#define PARALLELHUE_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_TOKENS_PER_RECORD 256
#define LEAD_UNKNOWN 0xFFFF
#define ROW_WIDTH 7
/* The Python side's contract with these files (accelerator.EXPECTED_ABI): bump it
 * with any change of a function's arguments, of the row layout or of the bytes. */
#define SPEEDUPS_ABI 7

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

/* Everything the files share stays inside the module (only PyInit__speedups is
 * exported): declared hidden, other files reach it without the GOT or the PLT. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* ------------------------------------------- names and ints made once (module.c) */
extern PyObject *str_outputs, *str_text, *str_index, *str_token_ids, *str_stop_reason;
extern PyObject *str_request_id, *str_new_token_ids, *str_finish_reason;
extern PyObject *str_step, *str_put, *str_empty;
/* 0..MAX_TOKENS_PER_RECORD (a row's counts, without a call each) */
extern PyObject *small_ints[MAX_TOKENS_PER_RECORD + 1];

/* --------------------------------------------------------- the module's parts */
extern PyTypeObject StreamRecorderType, CaptureStateType, SchedRequestType;
PyObject *scheduler_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *sampled_lengths(PyObject *module, PyObject *sampled);
PyObject *take_rows(PyObject *module, PyObject *seen);
PyObject *has_empty(PyObject *module, PyObject *fragments);
PyObject *take_lists(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#define ENCODER_DECLS(kind)                                                               \
    PyObject *encode_##kind##_step(PyObject *module, PyObject *const *args, Py_ssize_t n); \
    PyObject *encode_##kind##_body(PyObject *module, PyObject *const *args, Py_ssize_t n); \
    PyObject *encode_##kind##_frame(PyObject *module, PyObject *const *args, Py_ssize_t n);
ENCODER_DECLS(provenance)
ENCODER_DECLS(text)

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

/* ------------------------------------------------------------- helpers */
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
static inline int
append_meta(PyObject *meta, PyObject *const *values)
{
    return extend_list(meta, values, ROW_WIDTH);
}

/* The object types hold their references in one run of PyObject * fields
 * (first..last, nothing else between them): one traverse, clear and dealloc
 * over that run serves each of them. */
static inline int
visit_fields(PyObject **fields, size_t count, visitproc visit, void *arg)
{
    for (size_t i = 0; i < count; i++) {
        Py_VISIT(fields[i]);
    }
    return 0;
}

static inline void
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

#endif
