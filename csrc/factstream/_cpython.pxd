# C-API declarations the compiled modules share (as asyncpg's and uvloop's
# includes/python.pxd): what Cython's own cpython.* .pxd files do not declare.
# cimport it: ``from factstream._cpython cimport PyUnicode_New, ...``.

from cpython.object cimport PyObject

cdef extern from "Python.h":
    object PyUnicode_FromKindAndData(int kind, const void *buffer, Py_ssize_t size)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    # overflow_exception NULL: an out-of-range literal gives +-inf, as float() does.
    double PyOS_string_to_double(const char *s, char **endptr, PyObject *overflow_exception) except? -1.0
    object PyFloat_FromDouble(double v)
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    int PyUnicode_KIND(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    Py_UCS4 PyUnicode_READ(int kind, void *data, Py_ssize_t index)
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    int PyUnicode_4BYTE_KIND
    void PyObject_GC_UnTrack(void *op)
    void PyObject_GC_Track(void *op)
    bint PyObject_GC_IsTracked(object op)
    bint PyObject_IS_GC(PyObject *op)

    # Slot access: the offset a member descriptor publishes, and allocation without __init__.
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags

    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    ctypedef struct _SlotTypeObject "PyTypeObject":
        pass
    PyObject* _slot_generic_alloc "PyType_GenericAlloc"(_SlotTypeObject* t, Py_ssize_t n) except NULL

cdef extern from "structmember.h":
    # A member's type (an object slot made by __slots__ is T_OBJECT_EX) and its read-only flag.
    int T_OBJECT_EX
    int READONLY
