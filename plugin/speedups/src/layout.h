/* Attribute reads that know where CPython keeps an attribute (layout.c).
 *
 * The only code of the accelerator that depends on CPython's internal layout:
 * an exact int's one digit (small_int: the compact-int API from 3.12, the digit
 * array before), member descriptors (every supported CPython) and, on 3.11
 * only, the value array of an instance with shared keys. Each version guard is here; any other
 * CPython, type or object takes PyObject_GetAttr.
 */
#ifndef PARALLELHUE_LAYOUT_H
#define PARALLELHUE_LAYOUT_H

#include "speedups.h"

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

/* read_attr's out-of-line path (layout.c): learns where the type keeps the name
 * when it is not the type learnt, then reads it there or through getattr. */
#if defined(__GNUC__)
__attribute__((visibility("hidden")))
#endif
PyObject *read_attr_slow(PyObject *obj, PyObject *name, SlotReader *reader);

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

#endif
