# The codec's encoder (``include``d by _wire_c.pyx): commands to wire bytes,
# JSON written directly into one growing buffer (``_Out``) with Synapse's
# separators and escapes; ``encode`` and ``encode_lines``.
# It uses the names _wire_c.pyx cimports and the slot helpers of _slots.pxi.

cimport cython
from factstream._json_scan cimport _first_flagged16, _string_special16

# ------------------------------------------------------------------ encoding

cdef extern from "Python.h":
    # Documented in the C API (bytes objects): resize a bytes object only its caller holds.
    int _PyBytes_Resize(PyObject** bytes, Py_ssize_t newsize) except -1
    void Py_SET_SIZE(object o, Py_ssize_t size)


cdef enum:
    OUT_SHRINK_MOST = 262144  # _Out.take: the biggest buffer cut to length in place


@cython.final  # its methods called directly (no vtable), so the C compiler inlines them
cdef class _Out:
    """A growable byte buffer written inside the bytes object ``take`` usually returns.

    The bytes object only this buffer holds is resized as it grows and
    ``take`` hands it out, so a loop turn's encoded batch (tens of
    kilobytes) is not copied once more into a bytes object of its own.
    """

    cdef PyObject* data  # the bytes object written into (owned); NULL once taken
    cdef char* buf
    cdef Py_ssize_t len
    cdef Py_ssize_t cap

    def __cinit__(self):
        cdef object first = PyBytes_FromStringAndSize(NULL, 256)
        Py_INCREF(first)
        self.data = <PyObject*>first
        self.buf = PyBytes_AS_STRING(first)
        self.cap = 256
        self.len = 0

    def __dealloc__(self):
        Py_XDECREF(self.data)

    cdef inline int reserve(self, Py_ssize_t extra) except -1:
        if self.len + extra > self.cap:
            self._grow(self.len + extra)
        return 0

    cdef int _grow(self, Py_ssize_t need) except -1:
        # reserve's rare path, out of line: the inlined writes stay small.
        cdef Py_ssize_t cap = self.cap
        if self.data == NULL:
            raise ValueError("this buffer was taken")
        while cap < need:
            cap *= 2
        _PyBytes_Resize(&self.data, cap)  # on failure it frees the object and sets it NULL
        self.buf = PyBytes_AS_STRING(<object>self.data)
        self.cap = cap
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

    cdef inline int word4(self, const char* data) except -1:
        # Four bytes (``null``, ``true``): a fixed-size copy the compiler turns into one store.
        if self.len + 4 > self.cap:
            self.reserve(4)
        memcpy(self.buf + self.len, data, 4)
        self.len += 4
        return 0

    cdef bytes take(self):
        # The bytes written; the buffer is spent after. Up to OUT_SHRINK_MOST bytes (a loop turn's
        # batch, tens of kilobytes) the object itself is cut to length and handed out: no copy. A
        # bigger one is handed out as it is when at most a quarter of it is unused, and copied at its
        # exact size otherwise: shrinking a multi-megabyte block in place made the allocator give the
        # rest back and fault it in again on every call (37% slower than the copy).
        cdef PyObject* data = self.data
        cdef bytes out
        if data == NULL:
            raise ValueError("this buffer was taken")
        if self.cap > OUT_SHRINK_MOST and self.cap - self.len > self.cap // 4:
            return PyBytes_FromStringAndSize(self.buf, self.len)  # __dealloc__ frees the block
        self.data = NULL
        self.buf = NULL
        if self.cap <= OUT_SHRINK_MOST:
            _PyBytes_Resize(&data, self.len)
        else:
            Py_SET_SIZE(<object>data, self.len)  # a bytes object may say fewer bytes than its block holds
            PyBytes_AS_STRING(<object>data)[self.len] = 0  # bytes keep a NUL after their last byte
        self.cap = 0
        out = <bytes>data
        Py_DECREF(out)  # <bytes> took a reference of its own
        return out


cdef const char* _HEX = b"0123456789abcdef"


cdef inline Py_ssize_t _plain_ascii(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    # How many leading bytes of an ASCII string need no escape (``n``: none
    # does). Sixteen at a time with SSE2, the last sixteen re-read so that no
    # byte past the string is loaded; under sixteen, two overlapping words or bytes.
    cdef Py_ssize_t i = 0
    cdef unsigned int m
    cdef uint64_t mask
    if n < 16:
        # Short strings (a row's kinds and types): two overlapping eight-byte words, or a byte loop.
        if n >= 8:
            mask = _string_special8(_load8(p))
            if mask:
                return _first_flagged(mask)
            mask = _string_special8(_load8(p + n - 8))
            if mask:
                return n - 8 + _first_flagged(mask)
            return n
        while i < n and 0x20 <= p[i] < 0x7f and p[i] != C_QUOTE and p[i] != C_BACKSLASH:
            i += 1
        return i
    if _HAVE_SSE2:
        while i + 16 <= n:
            m = _string_special16(p + i)
            if m:
                return i + _first_flagged16(m)
            i += 16
        if i < n:
            m = _string_special16(p + n - 16) >> (16 - (n - i))  # only the bytes from i
            if m:
                return i + _first_flagged16(m)
        return n
    while i + 8 <= n:
        mask = _string_special8(_load8(p + i))
        if mask:
            return i + _first_flagged(mask)
        i += 8
    while i < n and 0x20 <= p[i] < 0x7f and p[i] != C_QUOTE and p[i] != C_BACKSLASH:
        i += 1
    return i


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
    if PyUnicode_IS_ASCII(s):
        ascii = <const char*>data
        i = _plain_ascii(<const unsigned char*>ascii, n)
        if i == n:  # most strings: nothing to escape, one copy between the quotes
            out.reserve(n + 2)
            out.buf[out.len] = 34
            memcpy(out.buf + out.len + 1, ascii, n)
            out.buf[out.len + n + 1] = 34
            out.len += n + 2
            return 0
        out.byte(34)
        run = 0
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
        out.byte(34)
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
    cdef bytes text
    if overflow:
        text = int.__repr__(o).encode("ascii")
        out.write(PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
        return 0
    return _enc_ll(out, v)


cdef inline int _enc_ll(_Out out, long long v) except -1:
    cdef char digits[24]
    cdef int i = 24
    cdef unsigned long long u
    u = (0ULL - <unsigned long long>v) if v < 0 else <unsigned long long>v
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


cdef enum:
    ENC_FALLBACK = -2  # _enc_value: a value only the stdlib encoder handles exactly (nothing raised)


cdef inline int _enc_leaf(_Out out, object o) except -1:
    # Writes ``o`` and returns 1 when it is a str, None, a bool or an exact int (a row's usual values,
    # written without a call of their own); 0, nothing written, for anything else.
    if type(o) is str:
        _enc_str(out, <str>o)
        return 1
    if o is None:
        out.word4(b"null")
        return 1
    if o is False:
        out.write(b"false", 5)
        return 1
    if o is True:
        out.word4(b"true")
        return 1
    if type(o) is int:
        _enc_int(out, o)
        return 1
    return 0


cdef inline int _enc_comma(_Out out, bint spaced) except -1:
    if spaced:
        out.write(b", ", 2)
    else:
        out.byte(44)
    return 0


cdef int _enc_value(_Out out, object o, int depth, bint spaced) except -1:
    # 0 when written; ENC_FALLBACK (the caller rewinds) for what only the stdlib encodes exactly: deep or
    # cyclic containers, non-str keys, floats out of range, other types. No exception for that: the usual
    # row costs no try block. ``spaced``: json.dumps' default separators (', ' and ': ', a table column's
    # text) instead of the wire's compact ones.
    cdef Py_ssize_t i, n, pos
    cdef PyObject* kp
    cdef PyObject* vp
    cdef bint first
    cdef bytes text
    cdef double d
    if _enc_leaf(out, o):
        return 0
    if depth >= MAX_DEPTH:
        return ENC_FALLBACK  # deep or cyclic: let the stdlib decide
    if type(o) is list:
        n = PyList_GET_SIZE(o)
        out.byte(91)
        for i in range(n):
            if i:
                _enc_comma(out, spaced)
            item = <object>PyList_GET_ITEM(o, i)
            if not _enc_leaf(out, item) and _enc_value(out, item, depth + 1, spaced) == ENC_FALLBACK:
                return ENC_FALLBACK
        out.byte(93)
        return 0
    if type(o) is tuple:
        n = PyTuple_GET_SIZE(o)
        out.byte(91)
        for i in range(n):
            if i:
                _enc_comma(out, spaced)
            item = <object>PyTuple_GET_ITEM(o, i)
            if not _enc_leaf(out, item) and _enc_value(out, item, depth + 1, spaced) == ENC_FALLBACK:
                return ENC_FALLBACK
        out.byte(93)
        return 0
    if type(o) is dict:
        out.byte(123)
        pos = 0
        first = True
        while PyDict_Next(o, &pos, &kp, &vp):
            if type(<object>kp) is not str:
                return ENC_FALLBACK
            if not first:
                _enc_comma(out, spaced)
            first = False
            _enc_str(out, <str><object>kp)
            if spaced:
                out.write(b": ", 2)
            else:
                out.byte(58)
            if _enc_value(out, <object>vp, depth + 1, spaced) == ENC_FALLBACK:
                return ENC_FALLBACK
        out.byte(125)
        return 0
    if type(o) is float:
        d = o
        if not isfinite(d):
            return ENC_FALLBACK  # refused; the stdlib gives the error
        text = float.__repr__(o).encode("ascii")
        out.write(PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text))
        return 0
    return ENC_FALLBACK


cdef int _enc_json(_Out out, object value, str what, str cmd) except -1:
    cdef Py_ssize_t mark = out.len
    if _enc_value(out, value, 0, False) != ENC_FALLBACK:
        return 0
    out.len = mark
    try:
        text = _dumps(value)
    except (ValueError, TypeError, RecursionError) as err:
        raise ProtocolError(f"cannot encode {cmd}: {what} is not JSON Synapse can carry ({err})") from None
    data = (<str>text).encode("ascii")
    out.write(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    return 0


# The last words (stream and instance names) written: each str once checked, then copied (a reference is
# held, so an identical pointer is the same immutable str).
cdef object _word_a = None
cdef object _word_b = None


cdef int _enc_word(_Out out, object value, str what, str cmd) except -1:
    cdef Py_ssize_t n, i
    cdef const char* s
    global _word_a, _word_b
    if (value is _word_a or value is _word_b) and value is not None:
        n = PyUnicode_GET_LENGTH(value)  # ASCII (only such words are kept): its bytes are its text
        out.write(<const char*>PyUnicode_DATA(value), n)
        return 0
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
    if type(value) is str and PyUnicode_IS_ASCII(value):
        _word_b = _word_a
        _word_a = value
    return 0


cdef int _enc_token(_Out out, object value, str what, str cmd) except -1:
    cdef int overflow = 0
    cdef long long v
    if type(value) is not int:
        if type(value) is bool or not isinstance(value, int):
            raise ProtocolError(f"cannot encode {cmd}: {what} must be int, not {type(value).__name__}")
    v = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        raise ProtocolError(f"cannot encode {cmd}: {what} {value} does not fit in 64 bits")
    return _enc_ll(out, v)


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
    if t is _USER_IP:
        mark = out.len
        try:
            out.write(b"USER_IP ", 8)
            _enc_word(out, cmd.user_id, "user_id", "USER_IP")
            out.byte(32)
            _enc_json(out, [cmd.access_token, cmd.ip, cmd.user_agent, cmd.device_id, cmd.last_seen], "fields", "USER_IP")
            return 0
        except ProtocolError:
            out.len = mark  # to_line below raises the error, in its own order
    elif t is _LOCK_RELEASED:
        mark = out.len
        try:
            out.write(b"LOCK_RELEASED ", 14)
            _enc_json(out, [cmd.instance_name, cmd.lock_name, cmd.lock_key], "fields", "LOCK_RELEASED")
            return 0
        except ProtocolError:
            out.len = mark
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
cdef object _USER_IP = UserIpCommand
cdef object _LOCK_RELEASED = LockReleasedCommand
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
    if type(cmds) is list or type(cmds) is tuple:
        out.reserve(len(cmds) * 160)  # a typical line: most batches never grow the buffer
    for cmd in cmds:
        _encode_into(out, cmd)
        out.byte(10)
    return out.take()


cdef int _resp_len(_Out out, Py_ssize_t n) except -1:
    # ``$<n>\r\n``: a RESP bulk string's length header.
    cdef char digits[24]
    cdef int i = 24
    while True:
        i -= 1
        digits[i] = <char>(48 + n % 10)
        n //= 10
        if n == 0:
            break
    out.byte(36)
    out.write(digits + i, 24 - i)
    out.write(b"\r\n", 2)
    return 0


cdef bytes _publish_header(bytes channel):
    return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n" % (len(channel), channel)


cdef enum:
    PUBLISH_TYPES = 32  # distinct command classes tracked in C per call (15 exist)


def encode_redis_publish(cmds, channel, user_ip_channel, counts) -> bytes:
    """The commands as pipelined Redis ``PUBLISH`` requests (RESP), one bytes object."""
    check_publish_args(channel, user_ip_channel, counts)
    cdef _Out out = _Out()
    cdef _Out line = _Out()
    cdef bytes main = _publish_header(channel)
    cdef bytes user_ip = _publish_header(user_ip_channel)
    cdef bytes header = main
    # Per command class seen: its count and whether it goes to the USER_IP
    # channel, in C arrays searched by pointer (a call sees a handful of
    # classes, mostly in runs); names are looked up once per class at the end.
    # ``alive`` holds a reference to each class for the duration of the call.
    cdef PyObject* types[PUBLISH_TYPES]
    cdef Py_ssize_t seen[PUBLISH_TYPES]
    cdef bint to_ip[PUBLISH_TYPES]
    cdef int ntypes = 0, cur = -1, i
    cdef PyObject* t
    cdef list alive = []
    cdef dict more = {}  # past PUBLISH_TYPES classes (only with many Command subclasses)
    if type(cmds) is list or type(cmds) is tuple:
        out.reserve(len(cmds) * 192)  # header + a typical line: most chunks never grow
    for cmd in cmds:
        line.len = 0
        _encode_into(line, cmd)
        t = <PyObject*>Py_TYPE(cmd)
        if cur < 0 or types[cur] != t:
            cur = -1
            for i in range(ntypes):
                if types[i] == t:
                    cur = i
                    break
            if cur < 0:
                if ntypes == PUBLISH_TYPES:
                    name = type(cmd).NAME
                    more[name] = more.get(name, 0) + 1
                    header = user_ip if name == "USER_IP" else main
                    out.write(PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header))
                    _resp_len(out, line.len)
                    out.write(line.buf, line.len)
                    out.write(b"\r\n", 2)
                    continue
                alive.append(type(cmd))
                cur = ntypes
                ntypes += 1
                types[cur] = t
                seen[cur] = 0
                to_ip[cur] = type(cmd).NAME == "USER_IP"
        seen[cur] += 1
        header = user_ip if to_ip[cur] else main
        out.write(PyBytes_AS_STRING(header), PyBytes_GET_SIZE(header))
        _resp_len(out, line.len)
        out.write(line.buf, line.len)
        out.write(b"\r\n", 2)
    # only once all of them encoded
    for i in range(ntypes):
        _count(counts, (<object>types[i]).NAME, seen[i])
    for name, n in more.items():
        _count(counts, name, n)
    return out.take()


cdef int _count(dict counts, object name, Py_ssize_t n) except -1:
    cdef PyObject* seen = PyDict_GetItem(counts, name)
    PyDict_SetItem(counts, name, (<object>seen) + n if seen != NULL else n)
    return 0


# ------------------------------------------------------------ table columns

cdef object _json_dumps = json.dumps


cdef str _column_text(_Out out, object value):
    # json.dumps(value) with its defaults: written by _enc_value (spaced) into ``out`` from its start, the
    # stdlib for anything that declines (and for its errors).
    cdef object text
    cdef Py_ssize_t n
    out.len = 0
    if _enc_value(out, value, 0, True) == ENC_FALLBACK:
        return _json_dumps(value)
    n = out.len
    text = PyUnicode_New(n, 127)
    memcpy(PyUnicode_DATA(text), out.buf, n)
    return <str>text


def column_text(value) -> str:
    """``json.dumps(value)`` (its defaults: ASCII, ``", "`` and ``": "``), as a table's JSON column holds it."""
    return _column_text(_Out(), value)


cdef class ColumnParams:
    """The parameters inserting one row into a table: ``(token, instance_name, *fields)`` (see ``_wire_py``)."""

    cdef readonly str table
    cdef readonly tuple json_flags
    cdef bytes _flags  # json_flags as bytes (0 or 1), read without a Python object per column
    cdef _Out _out
    cdef Py_ssize_t _n

    def __init__(self, str table, json_flags):
        self.table = table
        self.json_flags = tuple([bool(f) for f in json_flags])
        self._flags = bytes([1 if f else 0 for f in self.json_flags])
        self._n = len(self.json_flags)
        self._out = _Out()

    def params(self, token, instance_name, row) -> tuple:
        """``(token, instance_name, *fields)``; ValueError when the row has another number of fields."""
        cdef Py_ssize_t i, n = self._n
        cdef const char* flags = PyBytes_AS_STRING(self._flags)
        cdef object v
        if len(row) != n:
            raise ValueError(f"row has {len(row)} fields, table {self.table} has {n} columns")
        cdef tuple out = PyTuple_New(n + 2)
        Py_INCREF(token)
        PyTuple_SET_ITEM(out, 0, token)
        Py_INCREF(instance_name)
        PyTuple_SET_ITEM(out, 1, instance_name)
        for i in range(n):
            v = row[i]
            if flags[i]:
                v = _column_text(self._out, v)
            Py_INCREF(v)
            PyTuple_SET_ITEM(out, i + 2, v)
        return out
