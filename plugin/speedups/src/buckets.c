/* A step's columns handed from the hooks to the sender (hooks._Bucket.take, both sides). */
#include "speedups.h"

/* take_lists(*lists) -> tuple of lists: each list's items moved into a new
 * list (hooks._Bucket.take: a step's columns handed to the sender without a
 * copy); each given list is left empty with room for as many items again. */
PyObject *
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

