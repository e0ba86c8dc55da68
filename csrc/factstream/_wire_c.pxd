# What other compiled modules (the relay) call in the codec directly, without a Python call.

cdef object decode_row(object loads, object raw)

# A held row's array items, for the relay's typed rows (see _wire_rows.pxi).
from cpython.object cimport PyObject
cdef Py_ssize_t decode_row_items(object loads, object raw, PyObject** items, Py_ssize_t most, Py_ssize_t nest_at,
                                 PyObject** nested, Py_ssize_t nested_most, Py_ssize_t* nested_n) except -2

# The codec's free list of freed commands and typed rows (see _wire_c.pyx): the relay's deallocator keeps
# instances there and its allocations take them back.
cdef void* kept_take_fn() noexcept
cdef void* kept_keep_fn() noexcept
