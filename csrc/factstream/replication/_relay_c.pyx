# cython: language_level=3
"""The replication relay's hot loops, compiled twin of ``factstream.replication._relay_py``.

Same names, behaviour and results; the pure twin is the specification. The
gain is per row: building and reading the commands happens here without a
Python frame, and RdataCommand objects are allocated and read through their
slot offsets, as the compiled codec does.
"""

cimport cython
from cpython.object cimport PyObject, PyTypeObject, PyObject_GenericSetAttr, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_DECREF, Py_XDECREF
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.sequence cimport PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS
from cpython.dict cimport PyDict_GetItem, PyDict_GetItemWithError
from cpython.method cimport PyMethod_Check, PyMethod_GET_FUNCTION, PyMethod_GET_SELF
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.pyport cimport PY_SSIZE_T_MAX
from factstream._cpython cimport PyObject_GC_UnTrack, PyMemberDef, T_OBJECT_EX, READONLY
from factstream._wire_c cimport decode_row, decode_row_items, kept_keep_fn, kept_take_fn
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromSsize_t

from bisect import bisect_right

from factstream.commands import PositionCommand, RdataCommand
from factstream.commands import _UNSET as _UNSET_PY
from factstream.streams.rows import Row, wire_fields, wire_kinds
from factstream.streams.sources import UpdatesUnavailable, page

__all__ = ["RowWindow", "LocalWriter", "StreamEmitter", "Router", "Broadcast", "Fanout", "RowParser", "gather", "same_source", "tally"]

cdef object _RDATA = RdataCommand
cdef object _POSITION = PositionCommand
cdef object _ROW = Row
cdef object _UNSET = _UNSET_PY


include "factstream/_slots.pxi"

fs_kept_set(kept_take_fn(), kept_keep_fn())  # the codec's free list (see _wire_c.pyx)


cdef extern from *:
    r"""
    /* A token that is an exact int of at most one digit (below 2**30: every token a stream reaches in
       practice) as a C long in *v: 1, else 0 (the caller compares the objects). */
    static inline int fs_token_value(PyObject *o, long *v) {
        if (!PyLong_CheckExact(o))
            return 0;
    #if PY_VERSION_HEX >= 0x030C0000
        if (!PyUnstable_Long_IsCompact((PyLongObject *)o))
            return 0;
        *v = (long)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    #else
        {
            Py_ssize_t size = Py_SIZE(o);
            if (size == 0) {
                *v = 0;
                return 1;
            }
            if (size == 1 || size == -1) {
                *v = (long)((PyLongObject *)o)->ob_digit[0] * (long)size;
                return 1;
            }
            return 0;
        }
    #endif
    }
    """
    bint fs_token_value(object o, long* v) noexcept


cdef inline int _lt(object a, object b) except -1:
    # a < b for tokens: small exact ints compared in C, anything else by its own comparison.
    cdef long x, y
    if fs_token_value(a, &x) and fs_token_value(b, &y):
        return x < y
    return a < b


cdef inline int _le(object a, object b) except -1:
    cdef long x, y
    if fs_token_value(a, &x) and fs_token_value(b, &y):
        return x <= y
    return a <= b


cdef inline PyObject* _get(object obj, Py_ssize_t offset) noexcept:
    # Borrowed; NULL when the slot was never set.
    return (<PyObject**>((<char*><PyObject*>obj) + offset))[0]


cdef inline void _set(object obj, Py_ssize_t offset, object value) noexcept:
    # Replaces the slot's value, which may be NULL (fresh allocation).
    cdef PyObject** at = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = at[0]
    Py_INCREF(value)
    at[0] = <PyObject*>value
    Py_XDECREF(old)


cdef inline object _rdata(object stream, object instance, object token, object row):
    # RdataCommand(stream, instance, token, row) without running __init__.
    cmd = _rdata_untracked(stream, instance, token, row)
    _track_new(cmd)
    return cmd


cdef inline object _rdata_untracked(object stream, object instance, object token, object row):
    # _rdata, left out of the collector's lists (see StreamEmitter._just_added).
    return _rdata_new(stream, instance, token, row, None, False, None)


cdef inline object _wire(object row):
    if type(row) is list or type(row) is tuple:
        return row  # what a writer usually hands in: no isinstance walk per row
    if isinstance(row, _ROW):
        return row.to_wire()
    return row


cdef inline PyObject* _bound_to(object bound, object func, object cls) noexcept:
    # The instance of exactly ``cls`` that ``bound`` is ``func`` bound to (borrowed), else NULL: such a call
    # goes to the method's C body without a Python call (a subclass or any other callable is called).
    cdef PyObject* owner
    if PyMethod_Check(bound) and PyMethod_GET_FUNCTION(bound) == <PyObject*>func:
        owner = PyMethod_GET_SELF(bound)
        if <PyObject*>Py_TYPE(<object>owner) == <PyObject*>cls:
            return owner
    return NULL


cdef inline object _row_of(object cmd):
    # RdataCommand.row: decode the held bytes on first access, then forget them.
    cdef PyObject* row = _get(cmd, R_ROW)
    cdef PyObject* raw
    cdef PyObject* loads
    if row == NULL:
        return cmd.row  # not filled by a codec: let the property raise
    if row == <PyObject*>_UNSET:
        raw = _get(cmd, R_RAW)
        loads = _get(cmd, R_LOADS)
        if raw == NULL or loads == NULL or raw == <PyObject*>None or loads == <PyObject*>None:
            return cmd.row
        value = decode_row(<object>loads, <object>raw)
        _set(cmd, R_ROW, value)
        _set(cmd, R_RAW, None)
        _track_if_holding(cmd, value)  # a codec may have left the command untracked (see _slots.pxi)
        return value
    if _get(cmd, R_RAW) != <PyObject*>None:
        _set(cmd, R_RAW, None)
    return <object>row


cdef inline object _peek_row(object cmd):
    # The row to be typed: decoded from the held bytes without the command keeping it (the typed row is
    # what is handed out; the command stays as received, out of the cycle collector's lists).
    cdef PyObject* row = _get(cmd, R_ROW)
    cdef PyObject* raw
    cdef PyObject* loads
    if row == <PyObject*>_UNSET:
        raw = _get(cmd, R_RAW)
        loads = _get(cmd, R_LOADS)
        if raw != NULL and loads != NULL and raw != <PyObject*>None and loads != <PyObject*>None:
            decode = <object>loads  # held: the call may run any code
            data = <object>raw
            return decode_row(decode, data)
    return _row_of(cmd)


cdef inline object _parse_typed(RowParser parser, object cmd):
    # parser.parse(_peek_row(cmd)); held bytes go to the row class without being decoded into lists first.
    cdef PyObject* raw
    cdef PyObject* loads
    if _get(cmd, R_ROW) == <PyObject*>_UNSET:
        raw = _get(cmd, R_RAW)
        loads = _get(cmd, R_LOADS)
        if raw != NULL and loads != NULL and raw != <PyObject*>None and loads != <PyObject*>None:
            decode = <object>loads  # held: what follows may run code
            data = <object>raw
            row = parser.parse_held(decode, data)
            if row is not _NOT_HELD:
                return row
            return parser.parse(decode_row(decode, data))
    return parser.parse(_peek_row(cmd))


cdef class _Log:
    # One instance's rows, sorted by token; floor is None until rows were forgotten.
    cdef list tokens
    cdef list rows
    cdef object floor

    def __cinit__(self):
        self.tokens = []
        self.rows = []
        self.floor = None


cdef class RowWindow:
    """The recent rows of one in-memory stream, per writer instance (see ``_relay_py.RowWindow``)."""

    cdef object _capacity
    # Twice the capacity when it is an int that fits: add compares a log's length with it in C.
    cdef Py_ssize_t _most
    cdef dict _logs
    # The instance asked last and its log: a writer asks for itself every time.
    cdef object _last_name
    cdef _Log _last

    def __init__(self, capacity):
        self.capacity = capacity
        self._logs = {}
        self._last_name = None
        self._last = None

    @property
    def capacity(self):
        """Rows kept per writer instance (up to twice as many before the oldest are forgotten)."""
        return self._capacity

    @capacity.setter
    def capacity(self, value):
        self._capacity = value
        self._most = -1
        if type(value) is int and 0 <= value <= (PY_SSIZE_T_MAX // 2):
            self._most = 2 * <Py_ssize_t>value

    cdef _Log _find(self, object name, bint create):
        cdef _Log log
        if self._last is not None and (name is self._last_name or name == self._last_name):
            return self._last
        log = self._logs.get(name)
        if log is None:
            if not create:
                return None
            log = _Log()
            self._logs[name] = log
        self._last_name = name
        self._last = log
        return log

    def add(self, instance_name, token, row):
        """Record ``row`` written by ``instance_name`` at ``token`` (before the token completes)."""
        self._add(instance_name, token, row)

    @cython.boundscheck(False)  # list indices below are kept in range by the loop conditions
    @cython.wraparound(False)
    cdef int _add(self, object instance_name, object token, object row) except -1:
        cdef _Log log = self._find(instance_name, True)
        cdef list tokens = log.tokens
        cdef list rows = log.rows
        cdef Py_ssize_t n = PyList_GET_SIZE(tokens)
        cdef Py_ssize_t i
        if n and token < <object>PyList_GET_ITEM(tokens, n - 1):
            i = bisect_right(tokens, token)
            tokens.insert(i, token)
            rows.insert(i, row)
        else:
            tokens.append(token)
            rows.append(row)
        n = PyList_GET_SIZE(tokens)
        if self._most >= 0:
            if n > self._most:
                self._forget(log, n)
        elif n > self._capacity * 2:
            self._forget(log, n)
        return 0

    cdef int _forget(self, _Log log, Py_ssize_t n) except -1:
        # Drop the oldest rows down to capacity, never splitting a token; the last dropped token is the floor.
        cdef list tokens = log.tokens
        cdef Py_ssize_t cut = n - self._capacity
        while cut < n and tokens[cut] == tokens[cut - 1]:
            cut += 1
        log.floor = tokens[cut - 1]
        del tokens[:cut]
        del log.rows[:cut]
        return 0

    def get_updates_now(self, instance_name, from_token, upto_token, limit):
        """Rows of ``instance_name`` in ``(from_token, upto_token]``, paged by ``limit``."""
        cdef _Log log = self._find(instance_name, False)
        cdef list tokens, rows
        cdef Py_ssize_t n, lo, hi, i
        if log is None:
            return [], upto_token, False
        floor = log.floor
        if floor is not None and from_token < floor:
            raise UpdatesUnavailable(
                f"facts of {instance_name} after {from_token} are no longer in memory (kept from {floor}); "
                "raise MemoryUpdateSource capacity or back the stream with a table"
            )
        tokens = log.tokens
        n = PyList_GET_SIZE(tokens)
        if n == 0:
            return [], upto_token, False
        last = <object>PyList_GET_ITEM(tokens, n - 1)
        if last == upto_token and (n == 1 or <object>PyList_GET_ITEM(tokens, n - 2) <= from_token) and last > from_token:
            return [(last, <object>PyList_GET_ITEM(log.rows, n - 1))], upto_token, False
        lo = bisect_right(tokens, from_token)
        hi = bisect_right(tokens, upto_token)
        rows = log.rows
        updates = [(<object>PyList_GET_ITEM(tokens, i), <object>PyList_GET_ITEM(rows, i)) for i in range(lo, hi)]
        if hi - lo <= limit:
            return updates, upto_token, False
        return page(updates, upto_token, limit)


cdef class LocalWriter:
    """``write(rows)``: ``LocalStream.write`` without a Python frame (see ``_relay_py.LocalWriter``)."""

    cdef public object name
    cdef public object instance
    cdef public object add
    cdef public list listeners
    cdef public list pending
    cdef public object fallback
    cdef public object next
    cdef public object position

    def __init__(self, name, instance, add, list listeners not None, list pending not None, fallback, start):
        self.name = name
        self.instance = instance
        self.add = add
        self.listeners = listeners
        self.pending = pending
        self.fallback = fallback
        self.next = start
        self.position = start

    def write(self, rows):
        """Write ``rows`` at the next token and complete it; returns the token."""
        cdef PyObject* window
        cdef PyObject* router
        if PyList_GET_SIZE(self.pending):
            return self.fallback(rows)
        token = self.next = self.next + 1
        add, inst = self.add, self.instance
        window = _bound_to(add, _WINDOW_ADD, RowWindow)  # a MemoryUpdateSource's add: its C body directly
        for row in rows:
            if window != NULL:
                (<RowWindow>window)._add(inst, token, row)
            else:
                add(inst, token, row)
        old = self.position
        self.position = token
        for cb in self.listeners:
            router = _bound_to(cb, _ROUTER_NOTIFY, Router)  # a Publisher's notify: its C body directly
            if router != NULL:
                (<Router>router)._notify(self.name, inst, old, token)
            else:
                cb(self.name, inst, old, token)
        return token

    def write_many(self, facts):
        """Each of ``facts`` at its own next token, one move for the listeners (see the pure twin)."""
        token = done = self.next
        add, inst = self.add, self.instance
        try:
            for rows in facts:
                token += 1
                for row in rows:
                    add(inst, token, row)
                done = token
        finally:
            self.next = token
            if done > self.position:
                old = self.position
                self.position = done
                for cb in self.listeners:
                    cb(self.name, inst, old, done)
        return self.position


cdef class Broadcast  # defined below; publish_now hands it a single command directly


cdef class StreamEmitter:
    """What one writer has published of one stream (see ``_relay_py.StreamEmitter``)."""

    cdef public object name
    cdef public object instance
    cdef public object source
    cdef public object sent
    cdef public object target
    cdef public long long rows  # a C counter: no int object made per row published
    cdef public object sync_get
    cdef public list sinks
    cdef public object page_limit
    # The RowWindow whose get_updates_now sync_get is, if any: read directly, without a Python call.
    cdef RowWindow _window

    def __init__(self, name, instance, source, sent, sync_get, list sinks not None, page_limit):
        self.name = name
        self.instance = instance
        self.source = source
        self.sent = sent
        self.target = sent
        self.rows = 0
        self.sync_get = sync_get
        self.sinks = sinks
        self.page_limit = page_limit
        self._window = _window_of(sync_get)

    def __setattr__(self, name, value):
        # A replaced sync_get must not leave the old window read behind its back.
        PyObject_GenericSetAttr(self, name, value)
        if name == "sync_get":
            self._window = _window_of(value)

    @cython.boundscheck(False)  # the hot path: every index is below n by the loop conditions
    @cython.wraparound(False)
    cpdef list commands(self, updates, upto):
        """The commands publishing ``updates`` up to ``upto`` (see the pure twin)."""
        cdef list ups = updates if type(updates) is list else list(updates)
        cdef Py_ssize_t n = PyList_GET_SIZE(ups)
        cdef Py_ssize_t i, j, k
        cdef list cmds
        name, inst = self.name, self.instance
        if n == 1:
            u = ups[0]
            token = u[0]
            if upto == token and token > self.sent:
                self.sent = upto
                self.rows = self.rows + 1
                return [_rdata(name, inst, upto, _wire(u[1]))]
        cmds = []
        last = self.sent
        i = 0
        while i < n:
            token = ups[i][0]
            j = i
            while j + 1 < n and ups[j + 1][0] == token:
                j += 1
            if token > last:
                for k in range(i, j):
                    cmds.append(_rdata(name, inst, None, _wire(ups[k][1])))
                cmds.append(_rdata(name, inst, token, _wire(ups[j][1])))
                last = token
            i = j + 1
        if upto > last:
            cmds.append(PositionCommand(name, inst, last, upto))
        if upto > self.sent:
            self.sent = upto
        self.rows = self.rows + n
        return cmds

    cpdef publish_now(self):
        """Publish ``(sent, target]`` from the synchronous source into every sink, in pages."""
        self._publish()

    cdef int _publish(self) except -1:
        # publish_now's body: the Router of an exact StreamEmitter calls it without the cpdef dispatch.
        cdef list cmds
        sync_get = self.sync_get
        if sync_get is None:
            raise TypeError(f"stream {self.name!r} has no synchronous source; drain it asynchronously")
        while self.sent is not self.target and _lt(self.sent, self.target):  # the same token object: done
            cmd = self._just_added()
            if cmd is not None:
                # One command: a Broadcast appends it to each link's queue without a list of its own.
                for sink in self.sinks:
                    if type(sink) is Broadcast:
                        (<Broadcast>sink).send_one(cmd)
                    else:
                        _track_new(cmd)  # it may be kept: cycles through its row stay collectable
                        sink([cmd])
                continue
            updates, upto, _limited = sync_get(self.instance, self.sent, self.target, self.page_limit)
            cmds = self.commands(updates, upto)
            if cmds:
                for sink in self.sinks:
                    sink(cmds)
        return 0

    cdef object _just_added(self):
        # The writer's hot path, read from the window itself: the one row just added completes ``target``.
        # The same command as get_updates_now + commands give (their hot paths); None for anything else.
        cdef _Log log
        cdef Py_ssize_t n
        if self._window is None:
            return None
        log = self._window._find(self.instance, False)
        if log is None or (log.floor is not None and self.sent < log.floor):
            return None
        n = PyList_GET_SIZE(log.tokens)
        if n == 0:
            return None
        last = <object>PyList_GET_ITEM(log.tokens, n - 1)
        if not ((last is self.target or last == self.target) and _lt(self.sent, last)):  # (is: the writer's own token)
            return None
        prev = <object>PyList_GET_ITEM(log.tokens, n - 2) if n > 1 else None
        if n > 1 and prev is not self.sent and not _le(prev, self.sent):
            return None
        self.sent = self.target
        self.rows = self.rows + 1
        # Out of the collector's lists while only links' send queues hold it (publish_now and
        # Broadcast.send_one put it there before anything else sees it): it lives until the
        # loop turn's encode, and a writer's turn of 256 of them made every young collection
        # walk them (a third of the collector's time on the TCP path).
        return _rdata_untracked(self.name, self.instance, self.sent, _wire(<object>PyList_GET_ITEM(log.rows, n - 1)))


cdef object _WINDOW_ADD = RowWindow.__dict__["add"]


cdef RowWindow _window_of(object sync_get):
    # The compiled RowWindow whose bound get_updates_now ``sync_get`` is, else None.
    window = getattr(sync_get, "__self__", None)
    if type(window) is RowWindow and sync_get == (<RowWindow>window).get_updates_now:
        return <RowWindow>window
    return None


cdef class Router:
    """A writer's published streams by name (see ``_relay_py.Router``)."""

    cdef public object instance
    cdef public dict streams
    cdef public object on_async

    def __init__(self, instance, dict streams not None, on_async):
        self.instance = instance
        self.streams = streams
        self.on_async = on_async

    def notify(self, stream_name, instance_name, old, new):
        """Id-generator listener: ``instance_name``'s position in ``stream_name`` moved to ``new``."""
        self._notify(stream_name, instance_name, old, new)

    cdef int _notify(self, object stream_name, object instance_name, object old, object new) except -1:
        cdef StreamEmitter st
        em = self.streams.get(stream_name)
        if em is None or (instance_name is not self.instance and instance_name != self.instance):
            return 0
        if type(em) is not StreamEmitter:
            # Not ours (a test double): go through its Python attributes.
            if new <= em.target:
                return 0
            em.target = new
            if em.sync_get is not None:
                em.publish_now()
            else:
                self.on_async(stream_name)
            return 0
        st = <StreamEmitter>em
        if _le(new, st.target):
            return 0
        st.target = new
        if st.sync_get is not None:
            st._publish()
        else:
            self.on_async(stream_name)
        return 0


cdef object _ROUTER_NOTIFY = Router.__dict__["notify"]


cdef class Broadcast:
    """A publisher's sink handing each batch to every replicating connection (see ``_relay_py.Broadcast``)."""

    cdef public list targets
    # The connection class seen last and the offset of its send_queue slot (-1: read it with getattr).
    cdef object _conn_type
    cdef Py_ssize_t _queue_at

    def __init__(self, list targets not None):
        self.targets = targets
        self._conn_type = None
        self._queue_at = -1

    cdef inline object _queue(self, object conn):
        # getattr(conn, "send_queue", None); a class with plain attribute access that keeps send_queue in a
        # slot (TcpConnection) is read at the slot's offset, without a Python attribute lookup per command.
        cdef PyObject* queue
        if type(conn) is not self._conn_type:
            self._learn(type(conn))
        if self._queue_at >= 0:
            queue = _get(conn, self._queue_at)
            return <object>queue if queue != NULL else None
        return getattr(conn, "send_queue", None)

    cdef int _learn(self, object kind) except -1:
        self._conn_type = kind
        self._queue_at = -1
        if kind.__getattribute__ is object.__getattribute__:
            self._queue_at = _member_offset_or(kind, "send_queue")
        return 0

    def __call__(self, cmds):
        for conn in self.targets:
            queue = self._queue(conn)
            if type(queue) is list:
                (<list>queue).extend(cmds)  # what its send_many would do, without the call
            else:
                conn.send_many(cmds)

    cdef send_one(self, cmd):
        # self([cmd]), with the list made only for a connection without a send queue open.
        for conn in self.targets:
            queue = self._queue(conn)
            if type(queue) is list:
                (<list>queue).append(cmd)  # encoded at the end of the loop turn, then dropped
            else:
                _track_new(cmd)  # it may be kept: cycles through its row stay collectable
                conn.send_many([cmd])


cdef class Fanout:
    """A reader's handlers and update queues, and in-order delivery (see ``_relay_py.Fanout``)."""

    cdef public list handlers
    cdef public list queues
    cdef public object make_update
    cdef public object on_error
    # The key class seen last and the slot offsets of its rows and position (-1: set them by name).
    cdef object _key_type
    cdef Py_ssize_t _rows_at
    cdef Py_ssize_t _position_at

    def __init__(self, make_update, on_error):
        self.handlers = []
        self.queues = []
        self.make_update = make_update
        self.on_error = on_error
        self._key_type = None
        self._rows_at = self._position_at = -1

    cdef int _learn(self, object kind) except -1:
        # A key class with plain attribute access and rows/position in slots (the follower's) is moved
        # through the slots; any other through its attributes.
        self._key_type = kind
        self._rows_at = self._position_at = -1
        if kind.__setattr__ is not object.__setattr__ or kind.__getattribute__ is not object.__getattribute__:
            return 0
        rows_at = _member_offset_or(kind, "rows")
        position_at = _member_offset_or(kind, "position")
        if rows_at >= 0 and position_at >= 0:
            self._rows_at, self._position_at = rows_at, position_at
        return 0

    def deliver(self, key, facts):
        """Hand each fact of ``key`` to the handlers and queues, in order, moving ``key.position``."""
        cdef list source = self.handlers
        cdef list handlers
        cdef PyObject* count
        cdef long c
        cdef Py_ssize_t added
        if type(key) is not self._key_type:
            self._learn(type(key))
        stream, writer = key.stream, key.writer
        handlers = [h for only, h in source if only is None or only == stream]
        for token, rows in facts:
            if self.handlers is not source:
                source = self.handlers
                handlers = [h for only, h in source if only is None or only == stream]
            for handler in handlers:
                try:
                    handler(stream, writer, token, rows)
                except Exception:
                    self.on_error(handler, stream, writer, token)
            if self.queues:
                update = self.make_update(stream, writer, token, rows)
                for q in self.queues:
                    q.put_nowait(update)
            if self._rows_at >= 0:
                added = len(rows)
                count = _get(key, self._rows_at)
                if count != NULL:
                    held = <object>count  # a reference of our own while adding
                    if fs_token_value(held, &c):  # a small count (under 2**30): added in C
                        _set(key, self._rows_at, PyLong_FromSsize_t(<Py_ssize_t>c + added))
                    else:
                        _set(key, self._rows_at, held + added)
                    _set(key, self._position_at, token)
                    continue
            key.rows += len(rows)
            key.position = token


cdef Py_ssize_t _member_offset_or(object cls, str name) except -2:
    # The slot offset of ``name`` when the class's attribute of that name is a slot, else -1.
    for klass in cls.__mro__:
        descr = klass.__dict__.get(name)
        if descr is not None:
            if not _object_slot(descr):
                return -1
            return (<PyMemberDescrObject*><PyObject*>descr).d_member.offset
    return -1


# ---------------------------------------------------------------- typed rows


cdef class _Plain:
    # How to build one plain row class: allocate it and fill its field slots in order.
    cdef object cls
    cdef Py_ssize_t n
    cdef Py_ssize_t* offsets

    def __dealloc__(self):
        PyMem_Free(self.offsets)


cdef Py_ssize_t _member_offset(object cls, str name) except -1:
    # The slot's offset, from the member descriptor the class (or a base) holds for it.
    for klass in cls.__mro__:
        descr = klass.__dict__.get(name)
        if descr is not None:
            if not _object_slot(descr):
                raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
            return (<PyMemberDescrObject*><PyObject*>descr).d_member.offset
    raise TypeError(f"{cls.__name__} has no slot {name}")


cdef bint _object_slot(object descr):
    # A member descriptor of a writable object slot (what __slots__ makes), safe to fill at its offset.
    cdef PyMemberDef* member
    if type(descr).__name__ != "member_descriptor":
        return False
    member = (<PyMemberDescrObject*><PyObject*>descr).d_member
    return member.type == T_OBJECT_EX and not (member.flags & READONLY)


cdef _Plain _plain(object cls):
    # None when the class is built by its own from_wire (see rows.wire_fields).
    names = wire_fields(cls)
    if names is None:
        return None
    cdef _Plain plain = _Plain.__new__(_Plain)
    cdef Py_ssize_t i, n = len(names)
    plain.cls = cls
    plain.n = n
    plain.offsets = <Py_ssize_t*>PyMem_Malloc((n if n else 1) * sizeof(Py_ssize_t))
    if plain.offsets == NULL:
        raise MemoryError()
    for i in range(n):
        plain.offsets[i] = _member_offset(cls, names[i])
    _fast_dealloc(cls)  # its rows, one or two per fact on a reader, freed without the generic walk
    return plain


cdef inline bint _may_hold_cycles(PyObject* value) noexcept:
    # A value a cycle could run through; str, int, float, bool, None, bytes cannot (CPython's tuple rule).
    return PyObject_IS_GC(value) and (type(<object>value) is not tuple or PyObject_GC_IsTracked(<object>value))


cdef object _fill(_Plain plain, object seq):
    # cls(*seq) for a plain class: its generated __init__ does no more than store each value. None when
    # ``seq`` (an exact list or tuple) no longer has the class's field count once the row is allocated
    # (an allocation may run a collection, and a finalizer any code): the caller then falls back.
    cdef object obj = _alloc_untracked(plain.cls)
    cdef Py_ssize_t i, n
    cdef PyObject** items = _items(seq, &n)  # read after the allocation, with nothing running in between
    cdef bint atomic = True
    if items == NULL or n != plain.n:
        return None  # the empty row is simply freed
    for i in range(n):
        _put(obj, plain.offsets[i], <object>items[i])
        if atomic and _may_hold_cycles(items[i]):
            atomic = False
    if not atomic:
        # Tracked only when holding a container: frozen and holding none, it cannot be part of a cycle.
        _track_new(obj)
    return obj


cdef object _fill_pair(_Plain plain, object kind, object inner):
    # cls(kind, inner) for an events-style class; untracked when ``inner`` is a row left untracked here.
    cdef object obj = _alloc_untracked(plain.cls)
    _put(obj, plain.offsets[0], kind)
    _put(obj, plain.offsets[1], inner)
    if PyObject_GC_IsTracked(inner) or _may_hold_cycles(<PyObject*>kind):
        _track_new(obj)
    return obj


cdef object _fill_taking(_Plain plain, PyObject** items, Py_ssize_t n):
    # cls(*items) for a plain class of n fields from a C array of new references, which it takes (all of
    # them released if the allocation fails): _fill without a list to read them from.
    cdef object obj
    cdef Py_ssize_t i
    cdef bint atomic = True
    try:
        obj = _alloc_untracked(plain.cls)
    except BaseException:
        _release(items, n)
        raise
    for i in range(n):
        (<PyObject**>((<char*><PyObject*>obj) + plain.offsets[i]))[0] = items[i]  # the reference moves in
        if atomic and _may_hold_cycles(items[i]):
            atomic = False
    if not atomic:
        _track_new(obj)  # as _fill: tracked only when holding a container
    return obj


cdef inline void _release(PyObject** items, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        Py_XDECREF(items[i])


cdef object _list_taking(PyObject** items, Py_ssize_t n):
    # A list of n new references from a C array, which it takes (released if the list cannot be made).
    cdef PyObject* out
    cdef Py_ssize_t i
    try:
        value = PyList_New(n)
    except BaseException:
        _release(items, n)
        raise
    out = <PyObject*>value
    for i in range(n):
        PyList_SET_ITEM(<list>out, i, <object>items[i])  # steals: the reference moves in
    return value


cdef enum:
    HELD_ITEMS = 32  # fields of a row class built straight from held bytes (more: decoded into lists first)


cdef object _NOT_HELD = object()  # RowParser.parse_held: not this way, decode and parse


cdef inline PyObject** _items(object seq, Py_ssize_t* n) noexcept:
    # The items of an exact list or tuple (borrowed) and their count; NULL for anything else.
    if type(seq) is list or type(seq) is tuple:
        n[0] = PySequence_Fast_GET_SIZE(seq)
        return PySequence_Fast_ITEMS(seq)
    return NULL


cdef class RowParser:
    """``parser(row)``: ``row_type.from_wire(row)`` with plain rows built here (see ``_relay_py.RowParser``)."""

    cdef readonly object row_type
    cdef readonly object fallback
    cdef _Plain _plain
    cdef object _kinds
    cdef dict _subs
    cdef object _pair  # the (type, data) builder of an events-style class
    # The kind name met last (the exact str object), its class and builder, kept only within one
    # gather call (see forget) so a kind replaced in the live mapping is seen by the next call.
    cdef object _last_kind
    cdef _Plain _last_sub

    def __init__(self, row_type, fallback=None):
        self.row_type = row_type
        self.fallback = fallback if fallback is not None else row_type.from_wire
        self._kinds = wire_kinds(row_type)
        self._subs = {}
        self._plain = None
        self._pair = None
        if self._kinds is None:
            self._plain = _plain(row_type)
        elif type(self._kinds) is dict:
            # wire_kinds vouched for cls(kind, data) storing its two fields: build it as a plain pair.
            self._pair = _pair_of(row_type)
        else:
            self._kinds = None  # not a dict: leave every row to from_wire

    def __call__(self, row):
        self.forget()
        return self.parse(row)

    cdef inline void forget(self) noexcept:
        self._last_kind = None
        self._last_sub = None

    cdef object parse(self, object row):
        cdef Py_ssize_t n, m
        cdef PyObject** items = _items(row, &n)
        cdef _Plain sub
        if items != NULL:
            if self._plain is not None:
                if n == self._plain.n:
                    built = _fill(self._plain, row)
                    if built is not None:
                        return built
            elif self._pair is not None and n == 2 and type(<object>items[0]) is str:
                kind = <object>items[0]  # held: what follows may run code
                data = <object>items[1]
                if _items(data, &m) != NULL:
                    sub = self._kind_sub(kind)
                    if sub is not None and m == sub.n:
                        inner = _fill(sub, data)
                        if inner is not None:
                            return _fill_pair(<_Plain>self._pair, kind, inner)
        self.forget()  # the fallback runs Python code: it may change the mapping
        return self.fallback(row)

    cdef object parse_held(self, object loads, object raw):
        # parse(decode_row(loads, raw)) for a codec's held bytes, the row class filled from the JSON array's
        # values with no list made for the array (nor for the nested one of an events-style row). Another
        # shape of the same array is handed to parse as the lists decode_row makes; _NOT_HELD when the bytes
        # are not an array of at most the class's field count (the caller decodes them and calls parse).
        cdef PyObject* items[HELD_ITEMS]
        cdef PyObject* inner[HELD_ITEMS]
        cdef Py_ssize_t k, m = 0
        cdef _Plain plain = self._plain
        cdef _Plain sub
        if plain is not None:
            if plain.n > HELD_ITEMS:
                return _NOT_HELD
            k = decode_row_items(loads, raw, items, plain.n, -1, NULL, 0, NULL)
            if k < 0:
                return _NOT_HELD
            if k == plain.n:
                return _fill_taking(plain, items, k)
            return self.parse(_list_taking(items, k))  # fewer values than fields: parse decides, as before
        if self._pair is None:
            return _NOT_HELD
        k = decode_row_items(loads, raw, items, 2, 1, inner, HELD_ITEMS, &m)
        if k < 0:
            return _NOT_HELD
        # items[0]: the kind (a new reference), items[1] NULL, inner[:m]: the fields
        kind = <object>items[0]
        Py_DECREF(kind)  # the array's reference: ``kind`` holds the value now
        if type(kind) is str:
            try:
                sub = self._kind_sub(kind)
            except BaseException:
                _release(inner, m)
                raise
            if sub is not None and m == sub.n:
                return _fill_pair(<_Plain>self._pair, kind, _fill_taking(sub, inner, m))
        return self.parse([kind, _list_taking(inner, m)])  # any other shape: parse decides, as before

    @cython.final
    cdef _Plain _kind_sub(self, object kind):
        # The builder of the class of ``kind`` (an exact str), None when there is none. The kind met last
        # (the same name object as the row before) is remembered within one gather call (see forget).
        cdef PyObject* found
        if kind is self._last_kind:
            return self._last_sub
        found = PyDict_GetItemWithError(self._kinds, kind)  # exact str: cannot raise
        if found == NULL:
            return None
        sub = self._sub(<object>found)
        self._last_kind = kind
        self._last_sub = sub
        return sub

    cdef _Plain _sub(self, object kind_cls):
        cdef PyObject* found = PyDict_GetItemWithError(self._subs, kind_cls)  # a class: hashed by identity
        if found != NULL:
            return <_Plain>found
        sub = self._subs[kind_cls] = _plain(kind_cls)
        return <_Plain>sub


cdef _Plain _pair_of(object cls):
    cdef _Plain plain = _Plain.__new__(_Plain)
    plain.cls = cls
    plain.n = 2
    plain.offsets = <Py_ssize_t*>PyMem_Malloc(2 * sizeof(Py_ssize_t))
    if plain.offsets == NULL:
        raise MemoryError()
    plain.offsets[0] = _member_offset(cls, "type")
    plain.offsets[1] = _member_offset(cls, "data")
    _fast_dealloc(cls)
    return plain


def gather(cmds, Py_ssize_t start, position, list batch not None, parse=None, limit=None):
    """Fold the run of RDATA for one (stream, writer) at ``cmds[start]`` into facts (see the pure twin)."""
    cdef list seq = cmds if type(cmds) is list else list(cmds)
    cdef Py_ssize_t n = PyList_GET_SIZE(seq)
    cdef Py_ssize_t most
    if limit is not None:
        most = limit
        if most < 1:
            raise ValueError("gather: limit must be at least 1")
        if start + most < n:
            n = start + most
    cdef Py_ssize_t i = start
    cdef list facts = []
    cdef list rows
    cdef Py_ssize_t stale = 0
    cdef bint keep_all = position is None
    cdef RowParser parser = parse if type(parse) is RowParser else None
    if parser is not None:
        parser.forget()
    cdef PyObject* s
    cdef PyObject* w
    cdef PyObject* t
    if start < 0 or start >= n:
        raise IndexError("gather: start is outside cmds")
    first = <object>PyList_GET_ITEM(seq, start)
    stream, writer = first.stream_name, first.instance_name
    while i < n:
        cmd = <object>PyList_GET_ITEM(seq, i)
        if type(cmd) is not _RDATA:
            break
        s = _get(cmd, R_STREAM)
        w = _get(cmd, R_INSTANCE)
        if s == NULL or w == NULL:
            break
        if s != <PyObject*>stream and <object>s != stream:
            break
        if w != <PyObject*>writer and <object>w != writer:
            break
        if parser is not None:
            row = _parse_typed(parser, cmd)  # no Python call per row
        elif parse is not None:
            row = parse(_peek_row(cmd))
        else:
            row = _row_of(cmd)
        t = _get(cmd, R_TOKEN)
        token = <object>t if t != NULL else cmd.token
        i += 1
        if token is None:
            batch.append(row)
            continue
        if PyList_GET_SIZE(batch):
            batch.append(row)
            rows = batch
            batch = []
        else:
            rows = [row]  # the usual fact, one row: nothing waited, ``batch`` stays the empty list it is
        if keep_all:
            facts.append((token, rows))
        elif _lt(position, token):
            facts.append((token, rows))
            position = token
        else:
            stale += PyList_GET_SIZE(rows)
    return i, facts, batch, stale


def same_source(cmds):
    """How many of ``cmds``, from the first, are RDATA or POSITION of ``cmds[0]``'s stream and writer (see the pure twin)."""
    cdef list seq = cmds if type(cmds) is list else list(cmds)
    cdef Py_ssize_t n = PyList_GET_SIZE(seq)
    cdef Py_ssize_t i
    cdef bint has_position = False
    cdef PyObject* s
    cdef PyObject* w
    if n == 0:
        raise IndexError("same_source: cmds is empty")
    first = <object>PyList_GET_ITEM(seq, 0)
    stream, writer = first.stream_name, first.instance_name
    for i in range(n):
        cmd = <object>PyList_GET_ITEM(seq, i)
        if type(cmd) is _RDATA:
            s = _get(cmd, R_STREAM)
            w = _get(cmd, R_INSTANCE)
            if s == NULL or w == NULL:
                if cmd.stream_name != stream or cmd.instance_name != writer:
                    return i, has_position
                continue
            if (s != <PyObject*>stream and <object>s != stream) or (w != <PyObject*>writer and <object>w != writer):
                return i, has_position
        elif type(cmd) is _POSITION:
            if cmd.stream_name != stream or cmd.instance_name != writer:
                return i, has_position
            has_position = True
        else:
            return i, has_position
    return n, has_position


def tally(cmds):
    """How many of ``cmds`` there are of each command name."""
    cdef dict counts = {}
    cdef Py_ssize_t rdata = 0
    for cmd in cmds:
        if type(cmd) is _RDATA:
            rdata += 1
            continue
        name = cmd.NAME
        counts[name] = counts.get(name, 0) + 1
    if rdata:
        counts["RDATA"] = counts.get("RDATA", 0) + rdata
    return counts



# ---------------------------------------------------------------- deallocation of commands
#
# Every row is one RdataCommand on the writer and one on the reader, and CPython's generic deallocator
# for a class instance (subtype_dealloc: finalizer, weakref and __dict__ checks, a walk of every class's
# slots, the trashcan) cost more than the rest of freeing one. RdataCommand and PositionCommand have
# object slots only, so they are freed here as that walk would free them; so are the row classes a
# RowParser builds, when they too have object slots only.

cdef extern from *:
    r"""
    #define FS_FAST_TYPES 64  /* the commands and the row classes RowParser builds */
    static PyTypeObject *fs_fast_type[FS_FAST_TYPES];
    static Py_ssize_t fs_fast_first[FS_FAST_TYPES], fs_fast_end[FS_FAST_TYPES];
    static int fs_nfast = 0;

    /* The dealloc of a registered slot-only class, and the base dealloc subtype_dealloc calls for an
       instance of a subclass (which has by then cleared the subclass's own slots, __dict__ and weakrefs,
       and tracked the instance again): untrack, clear the class's object slots, free, release the type
       (an instance of a heap type holds a reference to it). */
    static void fs_slots_dealloc(PyObject *self) {
        PyTypeObject *tp = Py_TYPE(self);
        PyObject **at, **end;
        int i = 0;
        while (i < fs_nfast && fs_fast_type[i] != tp)
            i++;
        if (i == fs_nfast) {  /* a subclass: its registered base's slots */
            for (i = 0; i < fs_nfast && !PyType_IsSubtype(tp, fs_fast_type[i]); i++)
                ;
        }
        PyObject_GC_UnTrack(self);
        at = (PyObject **)((char *)self + fs_fast_first[i]);
        end = (PyObject **)((char *)self + fs_fast_end[i]);
        for (; at < end; at++)
            Py_CLEAR(*at);
        /* An exact registered class, still unreferenced after its slots let go: kept for the next. */
        if (fs_fast_type[i] == tp && Py_REFCNT(self) == 0 && fs_kept_keep_fn != NULL && fs_kept_keep_fn(self))
            return;
        tp->tp_free(self);
        Py_DECREF(tp);
    }

    /* Install it on t, whose object slots are [first, end) and nothing else (checked by the caller). */
    static int fs_fast_dealloc(PyTypeObject *t, Py_ssize_t first, Py_ssize_t end) {
        if (fs_nfast == FS_FAST_TYPES || t->tp_dealloc == fs_slots_dealloc)
            return 0;
        if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE) || !(t->tp_flags & Py_TPFLAGS_HAVE_GC) || t->tp_itemsize
            || t->tp_dictoffset || t->tp_weaklistoffset || t->tp_finalize || t->tp_del
            || t->tp_free != PyObject_GC_Del)
            return 0;
    #ifdef Py_TPFLAGS_MANAGED_DICT
        if (t->tp_flags & Py_TPFLAGS_MANAGED_DICT)
            return 0;
    #endif
    #ifdef Py_TPFLAGS_MANAGED_WEAKREF
        if (t->tp_flags & Py_TPFLAGS_MANAGED_WEAKREF)
            return 0;
    #endif
        fs_fast_type[fs_nfast] = t;
        fs_fast_first[fs_nfast] = first;
        fs_fast_end[fs_nfast] = end;
        fs_nfast++;
        Py_INCREF(t);  /* registered for the life of the process */
        t->tp_dealloc = fs_slots_dealloc;
        return 1;
    }
    """
    int fs_fast_dealloc(PyTypeObject* t, Py_ssize_t first, Py_ssize_t end)


cdef int _fast_dealloc(object cls) except -1:
    # The class's object slots must tile its instance after the object header, each a __slots__ member of
    # a class in its MRO, with no __dict__, __weakref__ or __del__ anywhere: then its instances are freed
    # by fs_slots_dealloc. Anything else keeps CPython's deallocator (returns 0).
    cdef Py_ssize_t first = sizeof(PyObject), end = cls.__basicsize__
    offsets = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        if "__del__" in klass.__dict__ or "__slots__" not in klass.__dict__:
            return 0
        for name in klass.__dict__["__slots__"] if not isinstance(klass.__dict__["__slots__"], str) else ():
            descr = klass.__dict__.get(name)
            if descr is None or not _object_slot(descr):
                return 0
            offsets.add((<PyMemberDescrObject*><PyObject*>descr).d_member.offset)
    if offsets != set(range(first, end, sizeof(PyObject*))):
        return 0
    return fs_fast_dealloc(<PyTypeObject*>cls, first, end)


_fast_dealloc(RdataCommand)
_fast_dealloc(PositionCommand)

