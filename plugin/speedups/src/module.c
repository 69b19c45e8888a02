/* parallelhue_vllm._speedups: optional C versions of the plugin's hottest code.
 *
 * Built per CPython as its own distribution (plugin/speedups, parallelhue-vllm-
 * speedups) or in place for a checkout (plugin/build_speedups.py); without it the
 * pure-Python code in hooks.py and wire.py does the same work (accelerator.py
 * chooses, once per process). What each file holds: speedups.h.
 */
#include "speedups.h"

PyObject *str_outputs, *str_text, *str_index, *str_token_ids, *str_stop_reason;
PyObject *str_request_id, *str_new_token_ids, *str_finish_reason;
PyObject *str_step, *str_put, *str_empty;
PyObject *small_ints[MAX_TOKENS_PER_RECORD + 1];

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
