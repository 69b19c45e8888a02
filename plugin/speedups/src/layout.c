/* Where a type keeps an attribute, learnt once per type version (layout.h). */
#include "layout.h"

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
PyObject *
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
