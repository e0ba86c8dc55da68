# Cython pure-Python-mode declarations for a copy of factstream/replication/_relay_py.py
# (benchmarks/bench_relay.py compiles that copy with this file, as aiohttp compiles
# its pure websocket reader): the classes become extension types with typed fields.

cdef class RowWindow:
    cdef public Py_ssize_t capacity
    cdef dict _tokens
    cdef dict _rows
    cdef dict _floor

cdef class StreamEmitter:
    cdef public str name
    cdef public str instance
    cdef public object source
    cdef public object sent
    cdef public object target
    cdef public Py_ssize_t rows
    cdef public object sync_get
    cdef public list sinks
    cdef public Py_ssize_t page_limit

cdef class Router:
    cdef public str instance
    cdef public dict streams
    cdef public object on_async

cdef class Fanout:
    cdef public list handlers
    cdef public list queues
    cdef public object make_update
    cdef public object on_error
