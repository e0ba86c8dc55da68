# Shared by the compiled modules that build or read commands (``include``d).
#
# Commands are plain Python classes with __slots__ (shared with the pure
# twins). Building them through object.__new__ and setattr costs more than
# parsing a line, so the hot ones are allocated directly and their slots
# filled and read at the offsets their member descriptors publish.
#
# The including module must cimport PyObject from cpython.object and
# Py_INCREF/Py_DECREF from cpython.ref, and import RdataCommand.

from factstream._cpython cimport (
    PyMemberDescrObject,
    PyObject_GC_IsTracked,
    PyObject_GC_Track,
    PyObject_IS_GC,
    _SlotTypeObject,
)


cdef Py_ssize_t _slot(object cls, str name) except -1:
    descr = cls.__dict__[name]
    if type(descr).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    return (<PyMemberDescrObject*><PyObject*>descr).d_member.offset


cdef extern from *:
    r"""
    /* The codec's free list of freed commands and typed rows (fs_kept_take in _wire_c.pyx), reached the
       same way from every module that includes this file: set once at import (fs_kept_set). */
    static PyObject *(*fs_kept_take_fn)(PyTypeObject *) = NULL;
    static int (*fs_kept_keep_fn)(PyObject *) = NULL;
    static void fs_kept_set(void *take, void *keep) {
        fs_kept_take_fn = (PyObject *(*)(PyTypeObject *))take;
        fs_kept_keep_fn = (int (*)(PyObject *))keep;
    }

    /* A fresh instance of the slot class t, every field NULL, not yet tracked by the cycle collector
       (the caller tracks it once it holds something a cycle could run through, or never): no
       track-then-untrack for the many that hold only strings and numbers. A class whose instances are not
       collected at all, or that has variable-size instances, gets PyType_GenericAlloc's. */
    static PyObject *fs_alloc_untracked(PyTypeObject *t) {
        PyObject *o;
        if (!PyType_IS_GC(t) || t->tp_itemsize != 0)
            return PyType_GenericAlloc(t, 0);
        if (fs_kept_take_fn != NULL && (o = fs_kept_take_fn(t)) != NULL)
            return o;  /* a freed instance of t: slots already empty, untracked */
        o = _PyObject_GC_New(t);
        if (o != NULL)
            memset((char *)o + sizeof(PyObject), 0, (size_t)(t->tp_basicsize - (Py_ssize_t)sizeof(PyObject)));
        return o;
    }
    """
    PyObject* fs_alloc_untracked(_SlotTypeObject* t) except NULL
    void fs_kept_set(void* take, void* keep)


cdef inline object _alloc_untracked(object cls):
    """``_alloc`` without the collector tracking the instance yet (see ``_track_new``)."""
    cdef PyObject* o = fs_alloc_untracked(<_SlotTypeObject*>cls)
    cdef object obj = <object>o
    Py_DECREF(obj)  # <object> took a reference of its own
    return obj


cdef inline void _track_new(object obj) noexcept:
    # Put an instance from _alloc_untracked in the collector's lists (a collected class only).
    if PyObject_IS_GC(<PyObject*>obj) and not PyObject_GC_IsTracked(obj):
        PyObject_GC_Track(<PyObject*>obj)


cdef inline object _alloc(object cls):
    """A fresh instance of ``cls`` with every slot empty (NULL), tracked as CPython's own allocation would
    track it; __init__ does not run."""
    cdef object obj = _alloc_untracked(cls)
    _track_new(obj)
    return obj


cdef inline void _put(object obj, Py_ssize_t offset, object value) noexcept:
    # The slot is empty (fresh allocation); it takes its own reference.
    Py_INCREF(value)
    (<PyObject**>((<char*><PyObject*>obj) + offset))[0] = <PyObject*>value


cdef Py_ssize_t R_STREAM = _slot(RdataCommand, "stream_name")
cdef Py_ssize_t R_INSTANCE = _slot(RdataCommand, "instance_name")
cdef Py_ssize_t R_TOKEN = _slot(RdataCommand, "token")
cdef Py_ssize_t R_ROW = _slot(RdataCommand, "_row")
cdef Py_ssize_t R_RAW = _slot(RdataCommand, "_raw")
cdef Py_ssize_t R_CANONICAL = _slot(RdataCommand, "_canonical")
cdef Py_ssize_t R_LOADS = _slot(RdataCommand, "_loads")


cdef inline object _rdata_new(object stream, object instance, object token, object row, object raw,
                              object canonical, object loads):
    # An RdataCommand with every slot filled, without running __init__, born outside the collector's
    # lists: the caller tracks it (_track_new) once a slot holds something a cycle could run through.
    cdef object cmd = _alloc_untracked(RdataCommand)  # every slot empty: filled without releasing anything
    _put(cmd, R_STREAM, stream)
    _put(cmd, R_INSTANCE, instance)
    _put(cmd, R_TOKEN, token)
    _put(cmd, R_ROW, row)
    _put(cmd, R_RAW, raw)
    _put(cmd, R_CANONICAL, canonical)
    _put(cmd, R_LOADS, loads)
    return cmd


cdef inline void _track_if_holding(object cmd, object value) noexcept:
    # Parsed commands leave the cycle collector's lists while every slot holds
    # a str, int, bytes or None (nothing that can lead back to them); a
    # container stored in one puts the command back, so cycles through it stay
    # collectable (the rule CPython applies to dicts of atomic values).
    if PyObject_IS_GC(<PyObject*>value) and not PyObject_GC_IsTracked(cmd):
        PyObject_GC_Track(<PyObject*>cmd)
