# cython: language_level=3
"""Compiled twin of the wire codec (see ``factstream._wire_py`` for the specification).

Works on the UTF-8 bytes directly: lines are found with memchr, headers are
sliced without copies, and the row JSON is validated in one pass that also
decides whether the bytes are already in Synapse's canonical encoding. The row
is only built into Python objects when ``RdataCommand.row`` is first read.

Invariants:
- every line handed to ``_parse`` has no newline and is valid UTF-8;
- ``_scan_*`` never read past ``end`` and never allocate;
- ``_build_*`` only run on bytes ``_scan_*`` accepted.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.long cimport PyLong_FromLongLong, PyLong_FromString
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_AsUTF8AndSize
from libc.stdint cimport int64_t, uint64_t
from libc.math cimport isfinite
from libc.string cimport memchr, memcmp, memcpy, memmove

import sys

from . import _json
from .commands import (
    COMMAND_MAP,
    ClearUserSyncsCommand,
    Command,
    FederationAckCommand,
    LockReleasedCommand,
    PositionCommand,
    RdataCommand,
    ReplicateCommand,
    UserIpCommand,
    UserSyncCommand,
)
from .commands import _UNSET
from .errors import ProtocolError

__all__ = ["parse_line", "encode", "encode_lines", "LineDecoder", "DEFAULT_MAX_LINE_LENGTH"]

from factstream._ascii cimport (
    C_0,
    C_9,
    C_BACKSLASH,
    C_BS,
    C_COLON,
    C_COMMA,
    C_CR,
    C_DOT,
    C_FF,
    C_LBRACE,
    C_LBRACKET,
    C_LF,
    C_LOWER_A,
    C_LOWER_B,
    C_LOWER_E,
    C_LOWER_F,
    C_LOWER_N,
    C_LOWER_R,
    C_LOWER_T,
    C_LOWER_U,
    C_MINUS,
    C_PLUS,
    C_QUOTE,
    C_RBRACE,
    C_RBRACKET,
    C_SLASH,
    C_SPACE,
    C_TAB,
    C_UPPER_A,
    C_UPPER_E,
    C_UPPER_F,
    C_UPPER_I,
    C_UPPER_N,
)
from factstream._cpython cimport (
    PyFloat_FromDouble,
    PyLong_AsLongLongAndOverflow,
    PyObject_GC_UnTrack,
    PyOS_string_to_double,
    PyUnicode_4BYTE_KIND,
    PyUnicode_DATA,
    PyUnicode_FromKindAndData,
    PyUnicode_GET_LENGTH,
    PyUnicode_IS_ASCII,
    PyUnicode_KIND,
    PyUnicode_New,
    PyUnicode_READ,
)

DEFAULT_MAX_LINE_LENGTH = 16384

cdef int MAX_DEPTH = _json.MAX_DEPTH
cdef object _dumps = _json.dumps
cdef object _RDATA = RdataCommand
cdef object _POSITION = PositionCommand


include "_slots.pxi"

cdef Py_ssize_t P_STREAM = _slot(PositionCommand, "stream_name")
cdef Py_ssize_t P_INSTANCE = _slot(PositionCommand, "instance_name")
cdef Py_ssize_t P_PREV = _slot(PositionCommand, "prev_token")
cdef Py_ssize_t P_NEW = _slot(PositionCommand, "new_token")
cdef object S_DATA_CLASS = COMMAND_MAP["PING"].__mro__[1]
cdef Py_ssize_t S_DATA = _slot(S_DATA_CLASS, "data")

include "_json_scan.pxi"


# -------------------------------------------------------------- RDATA slots

cdef object _UNSET_ROW = _UNSET


cdef inline PyObject* _slot_get(object obj, Py_ssize_t offset) noexcept:
    # Borrowed; NULL when the slot was never set.
    return (<PyObject**>((<char*><PyObject*>obj) + offset))[0]


cdef inline void _slot_set(object obj, Py_ssize_t offset, object value) noexcept:
    cdef PyObject** at = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = at[0]
    Py_INCREF(value)
    at[0] = <PyObject*>value
    Py_XDECREF(old)


cdef class _RowDescriptor:
    """``RdataCommand.row`` as a C descriptor: the same behaviour as the property it replaces, without a Python frame."""

    cdef readonly object __doc__

    def __init__(self, doc):
        self.__doc__ = doc

    def __get__(self, obj, objtype):
        cdef PyObject* row
        cdef PyObject* raw
        cdef PyObject* loads
        if obj is None:
            return self
        if type(obj) is not _RDATA and not isinstance(obj, _RDATA):
            raise TypeError(f"row belongs to RdataCommand, not {type(obj).__name__}")
        row = _slot_get(obj, R_ROW)
        if row == NULL:
            raise AttributeError("'RdataCommand' object has no attribute '_row'")
        if row == <PyObject*>_UNSET_ROW:
            raw = _slot_get(obj, R_RAW)
            loads = _slot_get(obj, R_LOADS)
            if raw == NULL or loads == NULL or raw == <PyObject*>None or loads == <PyObject*>None:
                raise AttributeError("RdataCommand has neither a row nor row bytes to decode")
            value = (<object>loads)(<object>raw)
            _slot_set(obj, R_ROW, value)
            row = <PyObject*>value
        # Once handed out the row may be mutated, so stop trusting the bytes.
        if _slot_get(obj, R_RAW) != <PyObject*>None:
            _slot_set(obj, R_RAW, None)
        _track_if_holding(obj, <object>row)
        return <object>row

    def __set__(self, obj, value):
        if type(obj) is not _RDATA and not isinstance(obj, _RDATA):
            raise TypeError(f"row belongs to RdataCommand, not {type(obj).__name__}")
        _slot_set(obj, R_ROW, value)
        _slot_set(obj, R_RAW, None)
        _track_if_holding(obj, value)

    def __delete__(self, obj):
        raise AttributeError("can't delete attribute 'row'")


# Both twins build the same RdataCommand class; with the compiled core loaded
# its ``row`` property runs in C (tests/test_wire.py checks the behaviour on both).
if type(RdataCommand.__dict__["row"]) is property:
    RdataCommand.row = _RowDescriptor(RdataCommand.__dict__["row"].__doc__)


# ------------------------------------------------------------ name cache
#
# Stream and instance names repeat on every line: the last few decoded ones
# are kept, keyed by their bytes, and shared (str is immutable).

cdef enum:
    NAME_SLOTS = 64  # a power of two
    NAME_MAX = 40
cdef PyObject* _name_str[NAME_SLOTS]
cdef unsigned char _name_bytes[NAME_SLOTS][NAME_MAX]
cdef Py_ssize_t _name_len[NAME_SLOTS]


cdef inline object _name(const unsigned char* p, Py_ssize_t n, str what, object line):
    cdef unsigned int h
    cdef object s
    if n == 0:
        raise ProtocolError(f"{what} is empty", line)
    if n > NAME_MAX:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    h = (<unsigned int>n * 31u + p[0] * 7u + p[n - 1] * 131u + p[n >> 1]) & (NAME_SLOTS - 1)
    if _name_len[h] == n and memcmp(_name_bytes[h], p, n) == 0:
        return <object>_name_str[h]
    s = PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    Py_INCREF(s)
    Py_XDECREF(_name_str[h])
    _name_str[h] = <PyObject*>s
    memcpy(_name_bytes[h], p, n)
    _name_len[h] = n
    return s


cdef int _scan_json(const unsigned char* p, Py_ssize_t n, bint* canonical, str what, object line) except -1:
    """Validate one JSON document; sets ``canonical``; raises ProtocolError."""
    cdef Scan s
    cdef const unsigned char* q
    s.start = p
    s.end = p + n
    s.err = ERR_NONE
    s.err_at = 0
    s.canonical = True
    s.int_limit = 640 if n <= 640 else _int_limit()
    q = _skip_ws(&s, p)
    q = _scan_value(&s, q, 0)
    if q != NULL:
        q = _skip_ws(&s, q)
        if q != s.end:
            _fail(&s, q, ERR_EXTRA)
            q = NULL
    if q == NULL:
        if s.err == ERR_DEPTH:
            msg = f"JSON nested deeper than {MAX_DEPTH} levels"
        else:
            msg = f"{_ERRORS[s.err].decode()} at char {s.err_at}"
        raise ProtocolError(f"{what} is not valid JSON ({msg})", line)
    canonical[0] = s.canonical
    return 0


# ----------------------------------------------------------------- JSON build

cdef class _Builder:
    """Builds Python objects from JSON bytes the scanner accepted."""

    cdef const unsigned char* end
    cdef Py_UCS4* buf
    cdef Py_ssize_t cap

    def __dealloc__(self):
        if self.buf != NULL:
            PyMem_Free(self.buf)

    cdef Py_UCS4* _ensure(self, Py_ssize_t n) except NULL:
        cdef Py_UCS4* nb
        if n > self.cap:
            nb = <Py_UCS4*>PyMem_Realloc(self.buf, n * sizeof(Py_UCS4))
            if nb == NULL:
                raise MemoryError()
            self.buf = nb
            self.cap = n
        return self.buf

    cdef inline const unsigned char* _ws(self, const unsigned char* p):
        while p < self.end and _is_ws(p[0]):
            p += 1
        return p

    cdef object build(self, const unsigned char* p, Py_ssize_t n):
        cdef object out
        self.end = p + n
        p = self._ws(p)
        out = self._value(&p)
        return out

    cdef object _value(self, const unsigned char** pp):
        cdef const unsigned char* p = pp[0]
        cdef unsigned char c = p[0]
        cdef object container, key, value
        if c == C_QUOTE:
            return self._string(pp)
        if c == C_LBRACKET:
            container = []
            p = self._ws(p + 1)
            if p[0] == C_RBRACKET:
                pp[0] = p + 1
                return container
            while True:
                pp[0] = p
                PyList_Append(container, self._value(pp))
                p = self._ws(pp[0])
                if p[0] == C_COMMA:
                    p = self._ws(p + 1)
                    continue
                pp[0] = p + 1  # ]
                return container
        if c == C_LBRACE:
            container = {}
            p = self._ws(p + 1)
            if p[0] == C_RBRACE:
                pp[0] = p + 1
                return container
            while True:
                pp[0] = p
                key = self._string(pp)
                p = self._ws(pp[0])
                pp[0] = self._ws(p + 1)  # past ':'
                value = self._value(pp)
                PyDict_SetItem(container, key, value)
                p = self._ws(pp[0])
                if p[0] == C_COMMA:
                    p = self._ws(p + 1)
                    continue
                pp[0] = p + 1  # }
                return container
        if c == C_LOWER_N:
            pp[0] = p + 4
            return None
        if c == C_LOWER_T:
            pp[0] = p + 4
            return True
        if c == C_LOWER_F:
            pp[0] = p + 5
            return False
        return self._number(pp)

    cdef object _number(self, const unsigned char** pp):
        cdef const unsigned char* p = pp[0]
        cdef const unsigned char* start = p
        cdef const unsigned char* end = self.end
        cdef bint is_float = False
        cdef long long v = 0
        cdef bint neg = False
        cdef Py_ssize_t ndigits
        cdef bytes text
        if p[0] == C_MINUS:
            neg = True
            p += 1
        if p[0] == C_0:
            p += 1
        else:
            while p < end and C_0 <= p[0] <= C_9:
                p += 1
        ndigits = p - start - neg
        p = _number_tail(p, end, &is_float)
        pp[0] = p
        if not is_float and ndigits <= 18:
            p = start + neg
            while p < start + neg + ndigits:
                v = v * 10 + (p[0] - 48)
                p += 1
            return PyLong_FromLongLong(-v if neg else v)
        text = PyBytes_FromStringAndSize(<const char*>start, pp[0] - start)  # NUL-terminated copy
        if is_float:
            # Same correctly rounded conversion as float(): an exponent past
            # the double range gives +-inf (Synapse's json module does the
            # same), one below it gives +-0.0. NULL, not None, asks for that:
            # None would be raised as an "exception" (a SystemError).
            return PyFloat_FromDouble(PyOS_string_to_double(PyBytes_AS_STRING(text), NULL, NULL))
        return PyLong_FromString(PyBytes_AS_STRING(text), NULL, 10)

    cdef object _string(self, const unsigned char** pp):
        cdef const unsigned char* p = pp[0] + 1
        cdef const unsigned char* start = p
        cdef const unsigned char* end = self.end
        cdef bint simple = True
        cdef Py_UCS4* out
        cdef Py_ssize_t n = 0
        cdef unsigned char c
        cdef unsigned int cp, cp2
        cdef int i
        cdef uint64_t w, mask
        cdef uint64_t high = 0
        cdef object text
        # The scanner accepted this string, so its closing quote is before end.
        while True:
            while p + 8 <= end:
                w = _load8(p)
                mask = _quote_or_backslash8(w)
                if mask:
                    i = _first_flagged(mask)
                    high |= w & ((<uint64_t>1 << (8 * i)) - 1)  # the bytes before it (none if i == 0)
                    p += i
                    break
                high |= w
                p += 8
            c = p[0]
            if c == C_QUOTE:
                break
            if c == C_BACKSLASH:
                simple = False
                p += 2
            else:
                high |= c
                p += 1
        if simple:
            pp[0] = p + 1
            if high & _SWAR_HIGH:
                return PyUnicode_DecodeUTF8(<const char*>start, p - start, NULL)
            text = PyUnicode_New(p - start, 127)  # ASCII: a copy, no decoding
            memcpy(PyUnicode_DATA(text), start, p - start)
            return text
        # Escapes present: decode into a code point buffer (at most one code
        # point per input byte).
        end = p
        out = self._ensure(end - start + 1)
        p = start
        while p < end:
            c = p[0]
            if c == C_BACKSLASH:
                c = p[1]
                if c == C_LOWER_U:
                    cp = 0
                    for i in range(2, 6):
                        cp = (cp << 4) | _hexval(p[i])
                    p += 6
                    if 0xD800 <= cp <= 0xDBFF and end - p >= 6 and p[0] == C_BACKSLASH and p[1] == C_LOWER_U:
                        cp2 = 0
                        for i in range(2, 6):
                            cp2 = (cp2 << 4) | _hexval(p[i])
                        if 0xDC00 <= cp2 <= 0xDFFF:
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (cp2 - 0xDC00)
                            p += 6
                    out[n] = cp
                else:
                    if c == C_LOWER_B:
                        out[n] = 8
                    elif c == C_LOWER_F:
                        out[n] = 12
                    elif c == C_LOWER_N:
                        out[n] = 10
                    elif c == C_LOWER_R:
                        out[n] = 13
                    elif c == C_LOWER_T:
                        out[n] = 9
                    else:  # " \ /
                        out[n] = c
                    p += 2
            elif c < 0x80:
                out[n] = c
                p += 1
            elif c < 0xE0:
                out[n] = ((c & 0x1F) << 6) | (p[1] & 0x3F)
                p += 2
            elif c < 0xF0:
                out[n] = ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F)
                p += 3
            else:
                out[n] = ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F)
                p += 4
            n += 1
        pp[0] = end + 1
        return PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, n)


cdef _Builder _BUILDER = _Builder()


def loads_row(raw):
    """Decode JSON bytes this codec has already validated."""
    cdef bytes data = raw
    return _BUILDER.build(<const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


cdef object _loads_row = loads_row


cdef object _loads_checked(const unsigned char* p, Py_ssize_t n, str what, object line):
    cdef bint canonical
    _scan_json(p, n, &canonical, what, line)
    return _BUILDER.build(p, n)


# -------------------------------------------------------------- line parsing

cdef inline str _text(const unsigned char* p, Py_ssize_t n):
    return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)


cdef inline object _word(const unsigned char* p, Py_ssize_t n, str what, object line):
    if n == 0:
        raise ProtocolError(f"{what} is empty", line)
    return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)


cdef object _int_field(const unsigned char* p, Py_ssize_t n, str what, object line):
    """ASCII digits with an optional leading '-', fitting a signed 64-bit int."""
    cdef long long v
    cdef int status = _parse_i64(p, n, &v)
    if status == INT_OK:
        return PyLong_FromLongLong(v)
    if status == INT_OVERFLOW:
        raise ProtocolError(f"{what} {_text(p, n)!r} does not fit in 64 bits", line)
    raise ProtocolError(f"{what} {_text(p, n)!r} is not an integer", line)


cdef inline const unsigned char* _space(const unsigned char* p, const unsigned char* end):
    return <const unsigned char*>memchr(p, 32, end - p)


cdef object _parse_rdata(const unsigned char* p, const unsigned char* end, object line):
    cdef const unsigned char* s1 = _space(p, end)
    cdef const unsigned char* s2
    cdef const unsigned char* s3
    cdef bint canonical
    cdef object cmd, token
    if s1 != NULL:
        s2 = _space(s1 + 1, end)
        if s2 != NULL:
            s3 = _space(s2 + 1, end)
            if s3 != NULL:
                stream = _name(p, s1 - p, "stream_name", line)
                instance = _name(s1 + 1, s2 - s1 - 1, "instance_name", line)
                if s3 - s2 - 1 == 5 and memcmp(s2 + 1, b"batch", 5) == 0:
                    token = None
                else:
                    token = _int_field(s2 + 1, s3 - s2 - 1, "token", line)
                _scan_json(s3 + 1, end - s3 - 1, &canonical, "row", line)
                cmd = _alloc(_RDATA)
                _put(cmd, R_STREAM, stream)
                _put(cmd, R_INSTANCE, instance)
                _put(cmd, R_TOKEN, token)
                _put(cmd, R_ROW, _UNSET)
                _put(cmd, R_RAW, PyBytes_FromStringAndSize(<const char*>s3 + 1, end - s3 - 1))
                _put(cmd, R_CANONICAL, True if canonical else False)
                _put(cmd, R_LOADS, _loads_row)
                PyObject_GC_UnTrack(<PyObject*>cmd)  # atomic slots only, see _track_if_holding
                return cmd
    raise ProtocolError("expected RDATA <stream_name> <instance_name> <token> <row_json>", line)


cdef object _parse_position(const unsigned char* p, const unsigned char* end, object line):
    cdef const unsigned char* s1 = _space(p, end)
    cdef const unsigned char* s2
    cdef const unsigned char* s3
    cdef object cmd
    if s1 != NULL:
        s2 = _space(s1 + 1, end)
        if s2 != NULL:
            s3 = _space(s2 + 1, end)
            if s3 != NULL:
                stream = _name(p, s1 - p, "stream_name", line)
                instance = _name(s1 + 1, s2 - s1 - 1, "instance_name", line)
                prev = _int_field(s2 + 1, s3 - s2 - 1, "prev_token", line)
                new = _int_field(s3 + 1, end - s3 - 1, "new_token", line)
                cmd = _alloc(_POSITION)
                _put(cmd, P_STREAM, stream)
                _put(cmd, P_INSTANCE, instance)
                _put(cmd, P_PREV, prev)
                _put(cmd, P_NEW, new)
                PyObject_GC_UnTrack(<PyObject*>cmd)  # str and int slots only
                return cmd
    raise ProtocolError("expected POSITION <stream_name> <instance_name> <prev_token> <new_token>", line)


cdef object _parse_user_sync(const unsigned char* p, const unsigned char* end, object line):
    cdef const unsigned char* s[4]
    cdef const unsigned char* q = p
    cdef int i
    for i in range(4):
        s[i] = _space(q, end)
        if s[i] == NULL:
            raise ProtocolError(
                "expected USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>", line
            )
        q = s[i] + 1
    state = _text(s[2] + 1, s[3] - s[2] - 1)
    if state != "start" and state != "end":
        raise ProtocolError(f"USER_SYNC state must be 'start' or 'end', not {state!r}", line)
    instance = _word(p, s[0] - p, "instance_id", line)
    user = _word(s[0] + 1, s[1] - s[0] - 1, "user_id", line)
    if s[2] - s[1] - 1 == 4 and memcmp(s[1] + 1, b"None", 4) == 0:
        device = None
    else:
        device = _word(s[1] + 1, s[2] - s[1] - 1, "device_id", line)
    last_sync = _int_field(s[3] + 1, end - s[3] - 1, "last_sync_ms", line)
    return UserSyncCommand(instance, user, device, state == "start", last_sync)


cdef object _parse_federation_ack(const unsigned char* p, const unsigned char* end, object line):
    cdef const unsigned char* s1 = _space(p, end)
    if s1 == NULL:
        raise ProtocolError("expected FEDERATION_ACK <instance_name> <token>", line)
    instance = _word(p, s1 - p, "instance_name", line)
    return FederationAckCommand(instance, _int_field(s1 + 1, end - s1 - 1, "token", line))


cdef object _parse_user_ip(const unsigned char* p, const unsigned char* end, object line):
    cdef const unsigned char* s1 = _space(p, end)
    if s1 == NULL:
        raise ProtocolError("expected USER_IP <user_id> <json_array>", line)
    fields = _loads_checked(s1 + 1, end - s1 - 1, "USER_IP fields", line)
    if type(fields) is not list or len(fields) != 5:
        raise ProtocolError(
            "USER_IP fields must be a JSON array [access_token, ip, user_agent, device_id, last_seen]", line
        )
    return UserIpCommand(_word(p, s1 - p, "user_id", line), *fields)


cdef object _parse_lock_released(const unsigned char* p, const unsigned char* end, object line):
    fields = _loads_checked(p, end - p, "LOCK_RELEASED fields", line)
    if type(fields) is not list or len(fields) != 3:
        raise ProtocolError("LOCK_RELEASED body must be a JSON array [instance_name, lock_name, lock_key]", line)
    return LockReleasedCommand(*fields)


cdef dict _SIMPLE = {
    name.encode(): cls
    for name, cls in COMMAND_MAP.items()
    if name not in ("RDATA", "POSITION", "USER_SYNC", "FEDERATION_ACK", "USER_IP", "LOCK_RELEASED", "REPLICATE")
}


cdef object _parse(const unsigned char* p, Py_ssize_t n, object line):
    """Parse one line (no newline); ``line`` is what error messages show."""
    cdef const unsigned char* end = p + n
    cdef const unsigned char* sp
    cdef const unsigned char* body
    cdef Py_ssize_t nlen
    if memchr(p, 10, n) != NULL:
        raise ProtocolError("line contains a newline", line)
    if not _all_ascii(p, n):
        try:
            PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
        except UnicodeDecodeError as err:
            raise ProtocolError(f"line is not valid UTF-8 ({err.reason} at byte {err.start})", line) from None
    sp = _space(p, end)
    if sp == NULL:
        nlen = n
        body = end
    else:
        nlen = sp - p
        body = sp + 1
    # Dispatch on length first: cheap and unambiguous for the hot commands.
    if nlen == 5 and memcmp(p, b"RDATA", 5) == 0:
        return _parse_rdata(body, end, line)
    if nlen == 8 and memcmp(p, b"POSITION", 8) == 0:
        return _parse_position(body, end, line)
    if nlen == 4 and memcmp(p, b"PING", 4) == 0:
        return _simple_cmd(_PING, body, end)
    if nlen == 9 and memcmp(p, b"USER_SYNC", 9) == 0:
        return _parse_user_sync(body, end, line)
    if nlen == 7 and memcmp(p, b"USER_IP", 7) == 0:
        return _parse_user_ip(body, end, line)
    if nlen == 9 and memcmp(p, b"REPLICATE", 9) == 0:
        return ReplicateCommand()  # Synapse ignores anything after REPLICATE
    if nlen == 14 and memcmp(p, b"FEDERATION_ACK", 14) == 0:
        return _parse_federation_ack(body, end, line)
    if nlen == 13 and memcmp(p, b"LOCK_RELEASED", 13) == 0:
        return _parse_lock_released(body, end, line)
    cls = _SIMPLE.get(PyBytes_FromStringAndSize(<const char*>p, nlen))
    if cls is not None:
        return _simple_cmd(cls, body, end)
    name = _text(p, nlen)
    if not _text(p, n).strip():
        raise ProtocolError("empty line", line)
    raise ProtocolError(f"unknown command {name!r}", line)


cdef object _PING = COMMAND_MAP["PING"]


cdef inline object _simple_cmd(object cls, const unsigned char* body, const unsigned char* end):
    cdef object cmd = _alloc(cls)
    _put(cmd, S_DATA, _text(body, end - body))
    return cmd


def parse_line(line) -> Command:
    """Parse one replication line (without its newline; one trailing ``\\n`` is allowed).

    Raises :class:`ProtocolError` for anything that is not a valid command.
    """
    cdef bytes data
    cdef Py_ssize_t n
    if type(line) is bytes:
        data = <bytes>line
    elif isinstance(line, str):
        if line.endswith("\n"):
            line = line[:len(line) - 1]
        try:
            data = (<str>line).encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError("line is not valid UTF-8 (it contains a lone surrogate)", line) from None
    elif isinstance(line, (bytes, bytearray, memoryview)):
        data = bytes(line)
        line = data
    else:
        raise TypeError(f"parse_line() takes bytes or str, not {type(line).__name__}")
    n = PyBytes_GET_SIZE(data)
    if n and PyBytes_AS_STRING(data)[n - 1] == b"\n"[0]:
        n -= 1
        if type(line) is bytes:
            line = line[:len(line) - 1]
    return _parse(<const unsigned char*>PyBytes_AS_STRING(data), n, line)


# ------------------------------------------------------------------ encoding

cdef class _Out:
    """A growable byte buffer."""

    cdef char* buf
    cdef Py_ssize_t len
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.cap = 256
        self.len = 0
        self.buf = <char*>PyMem_Malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.buf != NULL:
            PyMem_Free(self.buf)

    cdef inline int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self.len + extra
        cdef char* nb
        if need > self.cap:
            while self.cap < need:
                self.cap *= 2
            nb = <char*>PyMem_Realloc(self.buf, self.cap)
            if nb == NULL:
                raise MemoryError()
            self.buf = nb
        return 0

    cdef inline int write(self, const char* data, Py_ssize_t n) except -1:
        self.reserve(n)
        memcpy(self.buf + self.len, data, n)
        self.len += n
        return 0

    cdef inline int byte(self, char c) except -1:
        if self.len == self.cap:
            self.reserve(1)
        self.buf[self.len] = c
        self.len += 1
        return 0

    cdef bytes take(self):
        return PyBytes_FromStringAndSize(self.buf, self.len)


class _Fallback(Exception):
    """Raised inside the fast encoder for anything only the stdlib encoder handles exactly."""


cdef const char* _HEX = b"0123456789abcdef"


cdef int _enc_str(_Out out, str s) except -1:
    # ensure_ascii: '"' and '\\' escaped, \b \f \n \r \t short, other
    # controls and everything from DEL up as lowercase \uXXXX (astral as pairs).
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s)
    cdef int kind = PyUnicode_KIND(s)
    cdef void* data = PyUnicode_DATA(s)
    cdef Py_ssize_t i, run
    cdef unsigned int c
    cdef const char* ascii
    cdef uint64_t mask
    out.byte(34)
    if PyUnicode_IS_ASCII(s):
        ascii = <const char*>data
        run = 0
        i = 0
        while i < n:
            # eight characters at a time up to the next one that needs escaping
            while i + 8 <= n:
                mask = _string_special8(_load8(<const unsigned char*>ascii + i))
                if mask:
                    i += _first_flagged(mask)
                    break
                i += 8
            if i >= n:
                break
            c = <unsigned char>ascii[i]
            if c >= 0x20 and c != C_QUOTE and c != C_BACKSLASH and c != 0x7f:
                i += 1
                continue
            if i > run:
                out.write(ascii + run, i - run)
            run = i + 1
            _enc_char(out, c)
            i += 1
        if n > run:
            out.write(ascii + run, n - run)
    else:
        for i in range(n):
            c = PyUnicode_READ(kind, data, i)
            if 0x20 <= c < 0x7f and c != C_QUOTE and c != C_BACKSLASH:
                out.byte(<char>c)
            else:
                _enc_char(out, c)
    out.byte(34)
    return 0


cdef int _enc_u(_Out out, unsigned int c) except -1:
    cdef char esc[6]
    esc[0] = 92
    esc[1] = 117
    esc[2] = _HEX[(c >> 12) & 0xF]
    esc[3] = _HEX[(c >> 8) & 0xF]
    esc[4] = _HEX[(c >> 4) & 0xF]
    esc[5] = _HEX[c & 0xF]
    out.write(esc, 6)
    return 0


cdef int _enc_char(_Out out, unsigned int c) except -1:
    if c == C_QUOTE:
        out.write(b'\\"', 2)
    elif c == C_BACKSLASH:
        out.write(b"\\\\", 2)
    elif c == C_LF:
        out.write(b"\\n", 2)
    elif c == C_CR:
        out.write(b"\\r", 2)
    elif c == C_TAB:
        out.write(b"\\t", 2)
    elif c == C_BS:
        out.write(b"\\b", 2)
    elif c == C_FF:
        out.write(b"\\f", 2)
    elif c >= 0x10000:
        c -= 0x10000
        _enc_u(out, 0xD800 | ((c >> 10) & 0x3FF))
        _enc_u(out, 0xDC00 | (c & 0x3FF))
    else:
        _enc_u(out, c)
    return 0


cdef int _enc_int(_Out out, object o) except -1:
    cdef int overflow = 0
    cdef long long v = PyLong_AsLongLongAndOverflow(o, &overflow)
    cdef char digits[24]
    cdef int i = 24
    cdef unsigned long long u
    cdef bytes text
    if overflow:
        text = int.__repr__(o).encode("ascii")
        out.write(PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
        return 0
    u = <unsigned long long>(-v) if v < 0 else <unsigned long long>v
    while True:
        i -= 1
        digits[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    if v < 0:
        i -= 1
        digits[i] = 45
    out.write(digits + i, 24 - i)
    return 0


cdef int _enc_value(_Out out, object o, int depth) except -1:
    cdef Py_ssize_t i, n, pos
    cdef PyObject* kp
    cdef PyObject* vp
    cdef bint first
    cdef bytes text
    cdef double d
    t = type(o)
    if t is str:
        return _enc_str(out, <str>o)
    if o is None:
        out.write(b"null", 4)
        return 0
    if o is True:
        out.write(b"true", 4)
        return 0
    if o is False:
        out.write(b"false", 5)
        return 0
    if t is int:
        return _enc_int(out, o)
    if depth >= MAX_DEPTH:
        raise _Fallback()  # deep or cyclic: let the stdlib decide
    if t is list:
        n = PyList_GET_SIZE(o)
        out.byte(91)
        for i in range(n):
            if i:
                out.byte(44)
            _enc_value(out, <object>PyList_GET_ITEM(o, i), depth + 1)
        out.byte(93)
        return 0
    if t is tuple:
        n = PyTuple_GET_SIZE(o)
        out.byte(91)
        for i in range(n):
            if i:
                out.byte(44)
            _enc_value(out, <object>PyTuple_GET_ITEM(o, i), depth + 1)
        out.byte(93)
        return 0
    if t is dict:
        out.byte(123)
        pos = 0
        first = True
        while PyDict_Next(o, &pos, &kp, &vp):
            if type(<object>kp) is not str:
                raise _Fallback()
            if not first:
                out.byte(44)
            first = False
            _enc_str(out, <str><object>kp)
            out.byte(58)
            _enc_value(out, <object>vp, depth + 1)
        out.byte(125)
        return 0
    if t is float:
        d = o
        if not isfinite(d):
            raise _Fallback()  # refused; the stdlib gives the error
        text = float.__repr__(o).encode("ascii")
        out.write(PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
        return 0
    raise _Fallback()


cdef int _enc_json(_Out out, object value, str what, str cmd) except -1:
    cdef Py_ssize_t mark = out.len
    try:
        _enc_value(out, value, 0)
    except _Fallback:
        out.len = mark
        try:
            text = _dumps(value)
        except (ValueError, TypeError, RecursionError) as err:
            raise ProtocolError(f"cannot encode {cmd}: {what} is not JSON Synapse can carry ({err})") from None
        data = (<str>text).encode("ascii")
        out.write(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    return 0


cdef int _enc_word(_Out out, object value, str what, str cmd) except -1:
    cdef Py_ssize_t n, i
    cdef const char* s
    if type(value) is not str:
        if not isinstance(value, str):
            raise ProtocolError(f"cannot encode {cmd}: {what} must be str, not {type(value).__name__}")
    try:
        s = PyUnicode_AsUTF8AndSize(value, &n)
    except UnicodeEncodeError:
        raise ProtocolError(f"cannot encode {cmd}: a field contains a lone surrogate") from None
    if n == 0 or memchr(s, 32, n) != NULL or memchr(s, 10, n) != NULL:
        raise ProtocolError(f"cannot encode {cmd}: {what} must be non-empty with no spaces or newlines", value)
    out.write(s, n)
    return 0


cdef int _enc_token(_Out out, object value, str what, str cmd) except -1:
    cdef int overflow = 0
    if type(value) is not int:
        if type(value) is bool or not isinstance(value, int):
            raise ProtocolError(f"cannot encode {cmd}: {what} must be int, not {type(value).__name__}")
    PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        raise ProtocolError(f"cannot encode {cmd}: {what} {value} does not fit in 64 bits")
    return _enc_int(out, value)


cdef inline object _slot_or_attr(object cmd, Py_ssize_t offset, str name):
    # Exactly-typed commands hold their fields in slots; an empty slot (a
    # command made without __init__) goes through getattr for its usual error.
    cdef PyObject* v = _slot_get(cmd, offset)
    if v == NULL:
        return getattr(cmd, name)
    return <object>v


cdef int _encode_into(_Out out, object cmd) except -1:
    cdef bytes raw
    cdef object prefix
    cdef PyObject* rawp
    cdef Py_ssize_t mark
    t = type(cmd)
    if t is _RDATA:
        rawp = _slot_get(cmd, R_RAW)
        if rawp != NULL and rawp != <PyObject*>None and _slot_get(cmd, R_CANONICAL) == <PyObject*>True:
            out.write(b"RDATA ", 6)
            _enc_word(out, _slot_or_attr(cmd, R_STREAM, "stream_name"), "stream_name", "RDATA")
            out.byte(32)
            _enc_word(out, _slot_or_attr(cmd, R_INSTANCE, "instance_name"), "instance_name", "RDATA")
            out.byte(32)
            token = _slot_or_attr(cmd, R_TOKEN, "token")
            if token is None:
                out.write(b"batch", 5)
            else:
                _enc_token(out, token, "token", "RDATA")
            out.byte(32)
            out.write(PyBytes_AS_STRING(<bytes>rawp), PyBytes_GET_SIZE(<bytes>rawp))
            return 0
        out.write(b"RDATA ", 6)
        _enc_word(out, _slot_or_attr(cmd, R_STREAM, "stream_name"), "stream_name", "RDATA")
        out.byte(32)
        _enc_word(out, _slot_or_attr(cmd, R_INSTANCE, "instance_name"), "instance_name", "RDATA")
        out.byte(32)
        token = _slot_or_attr(cmd, R_TOKEN, "token")
        if token is None:
            out.write(b"batch", 5)
        else:
            _enc_token(out, token, "token", "RDATA")
        out.byte(32)
        raw = _slot_or_attr(cmd, R_RAW, "_raw")
        if raw is None:
            _enc_json(out, _slot_or_attr(cmd, R_ROW, "_row"), "row", "RDATA")  # no bytes held: _row is the value
        elif cmd._canonical:
            out.write(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
        else:
            _enc_json(out, cmd.row, "row", "RDATA")
        return 0
    if t is _POSITION:
        out.write(b"POSITION ", 9)
        _enc_word(out, _slot_or_attr(cmd, P_STREAM, "stream_name"), "stream_name", "POSITION")
        out.byte(32)
        _enc_word(out, _slot_or_attr(cmd, P_INSTANCE, "instance_name"), "instance_name", "POSITION")
        out.byte(32)
        _enc_token(out, _slot_or_attr(cmd, P_PREV, "prev_token"), "prev_token", "POSITION")
        out.byte(32)
        _enc_token(out, _slot_or_attr(cmd, P_NEW, "new_token"), "new_token", "POSITION")
        return 0
    prefix = _SIMPLE_PREFIX.get(t)
    if prefix is not None and _enc_simple(out, <bytes>prefix, cmd):
        return 0
    if t is _USER_SYNC:
        mark = out.len
        try:
            out.write(b"USER_SYNC ", 10)
            _enc_word(out, cmd.instance_id, "instance_id", "USER_SYNC")
            out.byte(32)
            _enc_word(out, cmd.user_id, "user_id", "USER_SYNC")
            out.byte(32)
            device = cmd.device_id
            if device is None:
                out.write(b"None", 4)
            else:
                _enc_word(out, device, "device_id", "USER_SYNC")
            if cmd.is_syncing:
                out.write(b" start ", 7)
            else:
                out.write(b" end ", 5)
            _enc_token(out, cmd.last_sync_ms, "last_sync_ms", "USER_SYNC")
            return 0
        except ProtocolError:
            out.len = mark  # to_line below raises the error, in its own order
    if not isinstance(cmd, Command):
        raise TypeError(f"encode() takes a Command, not {type(cmd).__name__}")
    text = cmd.NAME + " " + cmd.to_line()
    try:
        data = (<str>text).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(f"cannot encode {cmd.NAME}: a field contains a lone surrogate") from None
    out.write(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    return 0


cdef object _USER_SYNC = UserSyncCommand
# The commands whose body is one free-text ``data`` slot, by exact type.
cdef dict _SIMPLE_PREFIX = {
    cls: (cls.NAME + " ").encode() for cls in COMMAND_MAP.values() if S_DATA_CLASS in cls.__mro__ and cls.__mro__[1] is S_DATA_CLASS
}


cdef bint _enc_simple(_Out out, bytes prefix, object cmd) except -1:
    """Write ``NAME data``; False (nothing written) when the generic path must give the error."""
    cdef PyObject* data = _slot_get(cmd, S_DATA)
    cdef const char* p
    cdef Py_ssize_t n
    if data == NULL or type(<object>data) is not str:
        return False
    p = PyUnicode_AsUTF8AndSize(<object>data, &n) if PyUnicode_IS_ASCII(<object>data) else NULL
    if p == NULL or memchr(p, 10, n) != NULL:
        return False  # non-ASCII (maybe a lone surrogate) or a newline: to_line decides
    out.write(PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix))
    out.write(p, n)
    return True


def encode(cmd) -> bytes:
    """One line as published on Redis: ``NAME body``, UTF-8, no newline."""
    cdef _Out out = _Out()
    _encode_into(out, cmd)
    return out.take()


def encode_lines(cmds) -> bytes:
    """Newline-terminated lines for a TCP stream."""
    cdef _Out out = _Out()
    for cmd in cmds:
        _encode_into(out, cmd)
        out.byte(10)
    return out.take()


# ------------------------------------------------------------------- decoder

cdef inline bint _blank(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    # bytes.strip() whitespace: space, \t, \n, \r, \v, \f
    cdef Py_ssize_t i
    for i in range(n):
        if not (p[i] == C_SPACE or C_TAB <= p[i] <= C_CR):
            return False
    return True


cdef class LineDecoder:
    """Incremental decoder: feed bytes as they arrive, get completed commands.

    Partial lines are held across calls; blank lines are ignored. A line
    longer than ``max_line_length`` bytes is refused (and skipped up to its
    newline). When a line is bad, ``feed`` raises :class:`ProtocolError` whose
    ``commands`` holds the commands completed before it; the bytes after the
    bad line stay buffered and come out of the next ``feed`` (``feed(b"")``
    continues without new data).
    """

    cdef char* buf
    cdef Py_ssize_t len
    cdef Py_ssize_t cap
    cdef bint discarding
    cdef readonly Py_ssize_t max_line_length

    def __cinit__(self, Py_ssize_t max_line_length=DEFAULT_MAX_LINE_LENGTH):
        if max_line_length < 1:
            raise ValueError("max_line_length must be positive")
        self.max_line_length = max_line_length
        self.buf = NULL
        self.len = 0
        self.cap = 0
        self.discarding = False

    def __dealloc__(self):
        if self.buf != NULL:
            PyMem_Free(self.buf)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete line."""
        return self.len

    cdef int _keep(self, const char* data, Py_ssize_t n) except -1:
        # Replace the buffer contents with data[:n] (data may alias the buffer).
        cdef char* nb
        if n > self.cap:
            nb = <char*>PyMem_Malloc(n)
            if nb == NULL:
                raise MemoryError()
            memcpy(nb, data, n)
            PyMem_Free(self.buf)
            self.buf = nb
            self.cap = n
        elif n:
            memmove(self.buf, data, n)
        self.len = n
        return 0

    def feed(self, data) -> list:
        cdef bytes joined
        cdef const char* p
        cdef Py_ssize_t n, start, ln
        cdef const char* nl
        cdef list out = []
        cdef Py_ssize_t limit = self.max_line_length
        if type(data) is not bytes:
            data = bytes(data)
        if self.len:
            joined = PyBytes_FromStringAndSize(self.buf, self.len) + <bytes>data
            self.len = 0
        else:
            joined = <bytes>data
        p = PyBytes_AS_STRING(joined)
        n = PyBytes_GET_SIZE(joined)
        start = 0
        while True:
            nl = <const char*>memchr(p + start, 10, n - start)
            if nl == NULL:
                break
            ln = (nl - p) - start
            if self.discarding:  # the tail of a line already reported as too long
                self.discarding = False
                start += ln + 1
                continue
            if ln > limit:
                line = PyBytes_FromStringAndSize(p + start, ln)
                start += ln + 1
                self._keep(p + start, n - start)
                err = ProtocolError(f"line longer than {limit} bytes", line)
                err.commands = out
                raise err
            if _blank(<const unsigned char*>p + start, ln):
                start += ln + 1
                continue
            try:
                out.append(_parse(<const unsigned char*>p + start, ln, None))
            except ProtocolError as err:
                line = PyBytes_FromStringAndSize(p + start, ln)
                start += ln + 1
                self._keep(p + start, n - start)
                err2 = ProtocolError(err.reason, line)
                err2.commands = out
                raise err2 from None
            start += ln + 1
        if self.discarding:
            self.len = 0
        elif n - start > limit:
            line = PyBytes_FromStringAndSize(p + start, n - start)
            self.discarding = True
            self.len = 0
            err = ProtocolError(f"line longer than {limit} bytes", line)
            err.commands = out
            raise err
        else:
            self._keep(p + start, n - start)
        return out
