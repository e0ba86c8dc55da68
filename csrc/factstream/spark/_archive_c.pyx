# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of the archive column builder (see ``factstream.spark._archive_py``).

Columns live in C buffers laid out as Arrow wants them (validity bitmaps,
int32 offsets, value bytes), so a batch becomes Arrow arrays with one copy per
buffer and no Python object per line. ``feed`` computes the columns of the
common lines itself: all-ASCII RDATA (with the typed events/caches columns),
POSITION, USER_SYNC and the commands whose body is free text, bare or behind
the recorder's ISO-8601 timestamp and direction prefix (recorder ``#`` notes
too), or inside ``redis-cli MONITOR`` PUBLISH entries and ``--csv``
messages (the ``fmt`` given to ``feed``). Everything else (malformed lines
and prefixes, non-ASCII, escapes other than ``\\"`` and ``\\\\`` in redis-cli
quoting, escaped JSON strings in typed fields, rarer commands) goes to the row
function, the specification both twins share; any doubt means stepping aside,
never guessing.

``timestamp_columns`` turns the ``ts_text`` column into ``ts``/``date`` for a
fixed-offset session time zone, exactly as ``spark.timestamps.timestamp_micros``
does (non-ASCII text is handed to it).

Invariants:
- a row is either committed whole or rolled back (``_rollback`` undoes a
  partly written row from the offsets of the row's start);
- the fast path reads typed fields only from JSON the codec's scanner accepted.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy, memset

import sys

from .. import _json
from ._archive_py import COLUMNS, HEADER_COLUMNS, RowFunction, _valid_text
from ..commands import COMMAND_MAP

__all__ = ["ArchiveColumns", "COLUMNS", "HEADER_COLUMNS", "RowFunction"]

cdef int MAX_DEPTH = _json.MAX_DEPTH

include "factstream/_json_scan.pxi"

cdef enum:
    K_I64 = 0
    K_STR = 1
    K_BOOL = 2
    K_LIST = 3

cdef enum:
    C_LINE = 0
    C_TS_TEXT = 1
    C_DIRECTION = 2
    C_CHANNEL = 3
    C_COMMAND = 4
    C_STREAM = 5
    C_INSTANCE = 6
    C_TOKEN = 7
    C_PREV = 8
    C_ROW = 9
    C_DATA = 10
    C_EV_KIND = 13
    C_EV_EVENT_ID = 14
    C_EV_ROOM_ID = 15
    C_EV_TYPE = 16
    C_EV_STATE_KEY = 17
    C_EV_REJECTED = 21
    C_EV_OUTLIER = 22
    C_CACHE_FUNC = 23
    C_CACHE_KEYS = 24
    C_CACHE_TS = 25
    N_COLUMNS = 26

# A batch stops taking lines past this many value bytes (offsets are int32).
cdef Py_ssize_t BYTES_LIMIT = 1 << 30

cdef struct Col:
    int kind
    Py_ssize_t set_count
    uint8_t* valid       # validity bitmap
    int64_t* i64         # K_I64 values
    uint8_t* bits        # K_BOOL values (bitmap)
    int32_t* offsets     # K_STR / K_LIST: one more than rows
    char* data           # K_STR bytes, K_LIST child bytes
    Py_ssize_t dlen
    Py_ssize_t dcap
    int32_t* coffsets    # K_LIST child string offsets
    Py_ssize_t cn
    Py_ssize_t ccap

_KINDS = {"int64": K_I64, "string": K_STR, "bool": K_BOOL, "list<string>": K_LIST}
assert [name for name, _ in COLUMNS].index("cache_invalidation_ts") == C_CACHE_TS
assert len(COLUMNS) == N_COLUMNS
assert [name for name, _ in COLUMNS][:4] == ["line_number", "ts_text", "direction", "channel"]

cdef enum:
    M_LINES = 0
    M_MONITOR = 1
    M_CSV = 2
    M_OTHER = 3

# Archive formats (spark.formats) whose lines this builder reads itself.
_MODES = {"lines": M_LINES, "monitor": M_MONITOR, "redis-csv": M_CSV}

# Commands whose columns are just the name and the free-text body.
cdef tuple _TEXT_COMMANDS = tuple(
    name.encode() for name in COMMAND_MAP
    if name not in ("RDATA", "POSITION", "USER_SYNC", "FEDERATION_ACK", "USER_IP", "LOCK_RELEASED")
)


cdef inline const unsigned char* _jws(const unsigned char* p, const unsigned char* e) nogil:
    while p < e and _is_ws(p[0]):
        p += 1
    return p


cdef const unsigned char* _jskip(const unsigned char* p, const unsigned char* e) nogil:
    """Past one JSON value the scanner accepted."""
    cdef unsigned char c = p[0]
    cdef int depth = 0
    if c == 34:
        p += 1
        while p < e:
            if p[0] == 92:
                p += 2
            elif p[0] == 34:
                return p + 1
            else:
                p += 1
        return e
    if c == 91 or c == 123:
        while p < e:
            c = p[0]
            if c == 34:
                p = _jskip(p, e)
                continue
            if c == 91 or c == 123:
                depth += 1
            elif c == 93 or c == 125:
                depth -= 1
                if depth == 0:
                    return p + 1
            p += 1
        return e
    while p < e and not (p[0] == 44 or p[0] == 93 or p[0] == 125 or _is_ws(p[0])):
        p += 1
    return p


cdef inline const unsigned char* _jstr_end(const unsigned char* p, const unsigned char* e) nogil:
    """For a string starting at ``p`` (the quote): its closing quote, or NULL if it has escapes."""
    p += 1
    while p < e:
        if p[0] == 34:
            return p
        if p[0] == 92:
            return NULL
        p += 1
    return NULL


cdef int _items(const unsigned char* p, const unsigned char* e, const unsigned char** out, int cap) nogil:
    """The number of items of the array at ``p``; the first ``cap`` item starts go to ``out``."""
    cdef int count = 0
    p = _jws(p + 1, e)
    if p < e and p[0] == 93:
        return 0
    while p < e:
        if count < cap:
            out[count] = p
        count += 1
        p = _jws(_jskip(p, e), e)
        if p < e and p[0] == 44:
            p = _jws(p + 1, e)
            continue
        break
    return count


cdef bint _stream_header(const unsigned char* p, const unsigned char* end, const unsigned char** s1,
                         const unsigned char** s2, const unsigned char** s3) noexcept nogil:
    """The three spaces after ``<stream_name> <instance_name> <field>`` (RDATA, POSITION); False if a name is empty."""
    s1[0] = <const unsigned char*>memchr(p, 32, end - p)
    if s1[0] == NULL or s1[0] == p:
        return False
    s2[0] = <const unsigned char*>memchr(s1[0] + 1, 32, end - s1[0] - 1)
    if s2[0] == NULL or s2[0] == s1[0] + 1:
        return False
    s3[0] = <const unsigned char*>memchr(s2[0] + 1, 32, end - s2[0] - 1)
    return s3[0] != NULL


cdef class ArchiveColumns:
    """Collects archive rows in Arrow-shaped C buffers (API and semantics: ``_archive_py.ArchiveColumns``)."""

    cdef Col cols[N_COLUMNS]
    cdef int width
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef Py_ssize_t total
    cdef unsigned char* scratch  # a redis-cli payload, unquoted
    cdef Py_ssize_t scap
    cdef readonly bint typed

    def __cinit__(self, bint typed):
        cdef int k
        memset(self.cols, 0, sizeof(self.cols))
        self.typed = typed
        self.width = N_COLUMNS if typed else HEADER_COLUMNS
        for k in range(self.width):
            self.cols[k].kind = _KINDS[COLUMNS[k][1]]
        self._grow(1024)

    def __dealloc__(self):
        cdef int k
        for k in range(N_COLUMNS):
            PyMem_Free(self.cols[k].valid)
            PyMem_Free(self.cols[k].i64)
            PyMem_Free(self.cols[k].bits)
            PyMem_Free(self.cols[k].offsets)
            PyMem_Free(self.cols[k].data)
            PyMem_Free(self.cols[k].coffsets)
        PyMem_Free(self.scratch)

    def __len__(self):
        return self.n

    # ------------------------------------------------------------ buffers

    cdef int _grow(self, Py_ssize_t want) except -1:
        cdef Py_ssize_t cap = max(want, self.cap * 2)
        cdef Py_ssize_t old_bytes = (self.cap + 7) // 8
        cdef Py_ssize_t new_bytes = (cap + 7) // 8
        cdef int k
        cdef Col* c
        for k in range(self.width):
            c = &self.cols[k]
            c.valid = <uint8_t*>_realloc(c.valid, new_bytes)
            memset(c.valid + old_bytes, 0, new_bytes - old_bytes)
            if c.kind == K_I64:
                c.i64 = <int64_t*>_realloc(c.i64, cap * sizeof(int64_t))
            elif c.kind == K_BOOL:
                c.bits = <uint8_t*>_realloc(c.bits, new_bytes)
                memset(c.bits + old_bytes, 0, new_bytes - old_bytes)
            else:
                c.offsets = <int32_t*>_realloc(c.offsets, (cap + 1) * sizeof(int32_t))
                if self.cap == 0:
                    c.offsets[0] = 0
                if c.kind == K_LIST and c.coffsets == NULL:
                    c.ccap = 1024
                    c.coffsets = <int32_t*>_realloc(NULL, (c.ccap + 1) * sizeof(int32_t))
                    c.coffsets[0] = 0
        self.cap = cap
        return 0

    cdef inline int _bytes(self, Col* c, const char* p, Py_ssize_t n) except -1:
        cdef Py_ssize_t need = c.dlen + n
        if need > c.dcap:
            if need > 0x7FFFFFFF:
                raise OverflowError("an archive batch column grew past 2 GiB; use smaller batches")
            c.dcap = max(need, c.dcap * 2, 4096)
            c.data = <char*>_realloc(c.data, c.dcap)
        memcpy(c.data + c.dlen, p, n)
        c.dlen = need
        self.total += n
        return 0

    cdef inline void _valid(self, Col* c) noexcept nogil:
        c.valid[self.n >> 3] |= <uint8_t>(1 << (self.n & 7))
        c.set_count += 1

    cdef inline int _str(self, int k, const unsigned char* p, Py_ssize_t n) except -1:
        cdef Col* c = &self.cols[k]
        self._bytes(c, <const char*>p, n)
        self._valid(c)
        return 0

    cdef inline void _i64(self, int k, int64_t v) noexcept nogil:
        cdef Col* c = &self.cols[k]
        c.i64[self.n] = v
        self._valid(c)

    cdef inline void _bool(self, int k, bint v) noexcept nogil:
        cdef Col* c = &self.cols[k]
        if v:
            c.bits[self.n >> 3] |= <uint8_t>(1 << (self.n & 7))
        self._valid(c)

    cdef int _key(self, Col* c, const unsigned char* p, Py_ssize_t n) except -1:
        """One string of a list column's current row."""
        if c.cn == c.ccap:
            c.ccap *= 2
            c.coffsets = <int32_t*>_realloc(c.coffsets, (c.ccap + 1) * sizeof(int32_t))
        self._bytes(c, <const char*>p, n)
        c.cn += 1
        c.coffsets[c.cn] = <int32_t>c.dlen
        return 0

    cdef int _commit(self) except -1:
        cdef int k
        cdef Col* c
        for k in range(self.width):
            c = &self.cols[k]
            if c.kind == K_STR:
                c.offsets[self.n + 1] = <int32_t>c.dlen
            elif c.kind == K_LIST:
                c.offsets[self.n + 1] = <int32_t>c.cn
        self.n += 1
        if self.n == self.cap:
            self._grow(self.cap * 2)
        return 0

    cdef void _rollback(self) noexcept nogil:
        """Forget whatever was written of the current row."""
        cdef int k
        cdef Col* c
        cdef Py_ssize_t i = self.n
        cdef uint8_t bit = <uint8_t>(1 << (i & 7))
        for k in range(self.width):
            c = &self.cols[k]
            if c.valid[i >> 3] & bit:
                c.valid[i >> 3] &= ~bit
                c.set_count -= 1
            if c.kind == K_STR:
                self.total -= c.dlen - c.offsets[i]
                c.dlen = c.offsets[i]
            elif c.kind == K_LIST:
                c.cn = c.offsets[i]
                self.total -= c.dlen - c.coffsets[c.cn]
                c.dlen = c.coffsets[c.cn]
            elif c.kind == K_BOOL:
                c.bits[i >> 3] &= ~bit

    # -------------------------------------------------------- slow rows

    cdef int _text(self, int k, object value, bint key) except -1:
        cdef Col* c = &self.cols[k]
        cdef const char* p
        cdef Py_ssize_t n
        if type(value) is not str:
            raise TypeError(f"expected str for column {COLUMNS[k][0]}, got {type(value).__name__}")
        try:
            p = PyUnicode_AsUTF8AndSize(value, &n)
        except UnicodeEncodeError:
            value = _valid_text(value)
            p = PyUnicode_AsUTF8AndSize(value, &n)
        if key:
            self._key(c, <const unsigned char*>p, n)
        else:
            self._bytes(c, p, n)
        return 0

    cdef int _append(self, tuple values) except -1:
        cdef int k
        cdef Col* c
        for k in range(self.width):
            value = values[k]
            if value is None:
                continue
            c = &self.cols[k]
            if c.kind == K_I64:
                if type(value) is not int:
                    raise TypeError(f"expected int for column {COLUMNS[k][0]}, got {type(value).__name__}")
                self._i64(k, value)
            elif c.kind == K_STR:
                self._text(k, value, False)
                self._valid(c)
            elif c.kind == K_BOOL:
                if type(value) is not bool:
                    raise TypeError(f"expected bool for column {COLUMNS[k][0]}, got {type(value).__name__}")
                self._bool(k, value)
            else:
                for item in value:
                    self._text(k, item, True)
                self._valid(c)
        return 0

    def append(self, tuple values not None) -> None:
        """Add one row: a tuple of column values as the row function returns them."""
        if len(values) != self.width:
            raise ValueError(f"expected {self.width} column values, got {len(values)}")
        try:
            self._append(values)
        except BaseException:
            self._rollback()
            raise
        self._commit()

    # -------------------------------------------------------- fast rows

    cdef int _str_field(self, int k, const unsigned char* p, const unsigned char* e) except -1:
        """A string-typed JSON field: 1 if written or null, 0 to step aside (escapes)."""
        cdef const unsigned char* q
        if p[0] != 34:
            return 1  # not a string: null
        q = _jstr_end(p, e)
        if q == NULL:
            return 0
        self._str(k, p + 1, q - p - 1)
        return 1

    cdef inline void _bool_field(self, int k, const unsigned char* p) noexcept nogil:
        if p[0] == 116:
            self._bool(k, True)
        elif p[0] == 102:
            self._bool(k, False)

    cdef int _events(self, const unsigned char* p, Py_ssize_t n) except -1:
        """Typed columns of an events row; 1 done, 0 step aside."""
        cdef const unsigned char* e = p + n
        cdef const unsigned char* top[2]
        cdef const unsigned char* it[9]
        cdef const unsigned char* kind_end
        cdef Py_ssize_t klen
        cdef int count, k
        p = _jws(p, e)
        if p[0] != 91 or _items(p, e, top, 2) != 2 or top[1][0] != 91:
            return 1  # not [kind, [data...]]: every typed column null
        if top[0][0] != 34:
            return 1  # kind is not a string
        kind_end = _jstr_end(top[0], e)
        if kind_end == NULL:
            return 0
        count = _items(top[1], e, it, 9)
        klen = kind_end - top[0] - 1
        self._str(C_EV_KIND, top[0] + 1, klen)
        if klen == 2 and memcmp(top[0] + 1, b"ev", 2) == 0 and count == 9:
            for k in range(7):
                if not self._str_field(C_EV_EVENT_ID + k, it[k], e):
                    return 0
            self._bool_field(C_EV_REJECTED, it[7])
            self._bool_field(C_EV_OUTLIER, it[8])
        elif klen == 5 and memcmp(top[0] + 1, b"state", 5) == 0 and count == 4:
            if not (self._str_field(C_EV_ROOM_ID, it[0], e) and self._str_field(C_EV_TYPE, it[1], e)
                    and self._str_field(C_EV_STATE_KEY, it[2], e) and self._str_field(C_EV_EVENT_ID, it[3], e)):
                return 0
        elif klen == 9 and memcmp(top[0] + 1, b"state-all", 9) == 0 and count == 1:
            return self._str_field(C_EV_ROOM_ID, it[0], e)
        return 1

    cdef int _caches(self, const unsigned char* p, Py_ssize_t n) except -1:
        """Typed columns of a caches row; 1 done, 0 step aside."""
        cdef const unsigned char* e = p + n
        cdef const unsigned char* top[3]
        cdef const unsigned char* q
        cdef const unsigned char* s
        cdef const unsigned char* digits
        cdef long long v
        cdef Py_ssize_t i
        cdef Col* keys = &self.cols[C_CACHE_KEYS]
        p = _jws(p, e)
        if p[0] != 91 or _items(p, e, top, 3) != 3:
            return 1
        if not self._str_field(C_CACHE_FUNC, top[0], e):
            return 0
        if top[1][0] == 91:
            q = _jws(top[1] + 1, e)
            if q[0] != 93:
                while True:
                    if q[0] != 34:
                        return 0  # a non-string key: its JSON text is the row function's business
                    s = _jstr_end(q, e)
                    if s == NULL:
                        return 0
                    self._key(keys, q + 1, s - q - 1)
                    q = _jws(s + 1, e)
                    if q[0] == 44:
                        q = _jws(q + 1, e)
                        continue
                    break
            self._valid(keys)
        q = top[2]
        if q[0] == 45 or 48 <= q[0] <= 57:
            s = _jskip(q, e)
            digits = q + 1 if q[0] == 45 else q
            for i in range(s - q):
                if q[i] == 46 or q[i] == 101 or q[i] == 69:
                    return 1  # a float: null
            if s - digits > 18:
                return 0  # may not fit: let Python decide
            if _parse_i64(q, s - q, &v) != INT_OK:
                return 0
            self._i64(C_CACHE_TS, v)
        return 1

    cdef int _rdata(self, const unsigned char* p, const unsigned char* end, int64_t number) except -1:
        cdef const unsigned char* s1
        cdef const unsigned char* s2
        cdef const unsigned char* s3
        cdef const unsigned char* row
        cdef Py_ssize_t rn
        cdef long long token
        cdef bint batch
        cdef int done = 1
        if not _stream_header(p, end, &s1, &s2, &s3):
            return 0
        batch = s3 - s2 - 1 == 5 and memcmp(s2 + 1, b"batch", 5) == 0
        if not batch and _parse_i64(s2 + 1, s3 - s2 - 1, &token) != INT_OK:
            return 0
        row = s3 + 1
        rn = end - row
        if not _json_valid(row, rn, 640 if rn <= 640 else _int_limit()):
            return 0
        self._i64(C_LINE, number)
        self._str(C_COMMAND, <const unsigned char*>b"RDATA", 5)
        self._str(C_STREAM, p, s1 - p)
        self._str(C_INSTANCE, s1 + 1, s2 - s1 - 1)
        if not batch:
            self._i64(C_TOKEN, token)
        self._str(C_ROW, row, rn)
        if self.typed:
            if s1 - p == 6 and memcmp(p, b"events", 6) == 0:
                done = self._events(row, rn)
            elif s1 - p == 6 and memcmp(p, b"caches", 6) == 0:
                done = self._caches(row, rn)
            if not done:
                self._rollback()
                return 0
        self._commit()
        return 1

    cdef int _position(self, const unsigned char* p, const unsigned char* end, int64_t number) except -1:
        cdef const unsigned char* s1
        cdef const unsigned char* s2
        cdef const unsigned char* s3
        cdef long long prev, new
        if not _stream_header(p, end, &s1, &s2, &s3):
            return 0
        if _parse_i64(s2 + 1, s3 - s2 - 1, &prev) != INT_OK or _parse_i64(s3 + 1, end - s3 - 1, &new) != INT_OK:
            return 0
        self._i64(C_LINE, number)
        self._str(C_COMMAND, <const unsigned char*>b"POSITION", 8)
        self._str(C_STREAM, p, s1 - p)
        self._str(C_INSTANCE, s1 + 1, s2 - s1 - 1)
        self._i64(C_TOKEN, new)
        self._i64(C_PREV, prev)
        self._commit()
        return 1

    cdef int _user_sync(self, const unsigned char* p, const unsigned char* end, int64_t number) except -1:
        """USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>: checked as the codec does."""
        cdef const unsigned char* s[4]
        cdef const unsigned char* q = p
        cdef Py_ssize_t slen
        cdef long long last_sync
        cdef int i
        for i in range(4):
            s[i] = <const unsigned char*>memchr(q, 32, end - q)
            if s[i] == NULL or s[i] == q:
                return 0  # missing or empty field (an empty device_id too)
            q = s[i] + 1
        slen = s[3] - s[2] - 1
        if not ((slen == 5 and memcmp(s[2] + 1, b"start", 5) == 0) or (slen == 3 and memcmp(s[2] + 1, b"end", 3) == 0)):
            return 0
        if _parse_i64(s[3] + 1, end - s[3] - 1, &last_sync) != INT_OK:
            return 0
        self._i64(C_LINE, number)
        self._str(C_COMMAND, <const unsigned char*>b"USER_SYNC", 9)
        self._str(C_DATA, p, end - p)
        self._commit()
        return 1

    cdef int _fast(self, const unsigned char* p, Py_ssize_t n, int64_t number) except -1:
        """Columns of one all-ASCII line starting with a capital: 1 done, 0 step aside."""
        cdef const unsigned char* end = p + n
        cdef const unsigned char* sp = <const unsigned char*>memchr(p, 32, n)
        cdef Py_ssize_t nlen = (sp - p) if sp != NULL else n
        cdef const unsigned char* body = (sp + 1) if sp != NULL else end
        cdef bytes name
        if nlen == 5 and memcmp(p, b"RDATA", 5) == 0:
            return self._rdata(body, end, number)
        if nlen == 8 and memcmp(p, b"POSITION", 8) == 0:
            return self._position(body, end, number)
        if nlen == 9 and memcmp(p, b"USER_SYNC", 9) == 0 and sp != NULL:
            return self._user_sync(body, end, number)
        for name in _TEXT_COMMANDS:
            if PyBytes_GET_SIZE(name) == nlen and memcmp(p, PyBytes_AS_STRING(name), nlen) == 0:
                self._i64(C_LINE, number)
                self._str(C_COMMAND, p, nlen)
                if sp != NULL:
                    self._str(C_DATA, body, end - body)
                self._commit()
                return 1
        return 0

    # ------------------------------------------------- prefixes and captures

    cdef int _note(self, const unsigned char* p, const unsigned char* e, int64_t number) except -1:
        """A recorder note ``<word> [text]`` (after ``<ts> # ``): command ``#<word>``, data the text."""
        cdef const unsigned char* sp = <const unsigned char*>memchr(p, 32, e - p)
        cdef Col* c = &self.cols[C_COMMAND]
        self._i64(C_LINE, number)
        self._bytes(c, b"#", 1)
        self._bytes(c, <const char*>p, (sp - p) if sp != NULL else (e - p))
        self._valid(c)
        if sp != NULL:
            self._str(C_DATA, sp + 1, e - sp - 1)
        self._commit()
        return 1

    cdef int _prefixed(self, const unsigned char* p, Py_ssize_t n, int64_t number) except -1:
        """A ``lines`` line with a timestamp and/or direction prefix (``spark.formats.split_line``)."""
        cdef const unsigned char* e = p + n
        cdef const unsigned char* q = p
        cdef const unsigned char* ts = NULL
        cdef Py_ssize_t tslen = 0
        cdef unsigned char d = 0
        cdef int done
        if 48 <= p[0] <= 57:
            tslen = _iso_len(p, e)
            if tslen == 0:
                return 0
            ts = p
            q = p + tslen
            if q >= e or q[0] != 32:
                return 0
            while q < e and q[0] == 32:
                q += 1
            if q >= e:
                return 0
        if q[0] == 60 or q[0] == 62 or (q[0] == 35 and ts != NULL):  # '<' '>', '#' after a timestamp
            d = q[0]
            q += 1
            if q >= e or q[0] != 32:
                return 0
            while q < e and q[0] == 32:
                q += 1
            if q >= e:
                return 0
        if ts == NULL and d == 0:
            return 0
        if d != 35 and not (65 <= q[0] <= 90):
            return 0  # not a command name: the codec's error message is the row function's business
        if ts != NULL:
            self._str(C_TS_TEXT, ts, tslen)
        if d != 0:
            self._str(C_DIRECTION, &d, 1)
        if d == 35:
            done = self._note(q, e, number)
        else:
            done = self._fast(q, e - q, number)
        if not done:
            self._rollback()
        return done

    cdef Py_ssize_t _unquote(self, const unsigned char* p, const unsigned char* e) except -2:
        """redis-cli's quoted string body ``[p, e)`` into ``scratch``: its length, -1 to step aside."""
        cdef Py_ssize_t k = 0
        cdef unsigned char c
        if e - p > self.scap:
            self.scap = max(e - p, 2 * self.scap, 4096)
            self.scratch = <unsigned char*>_realloc(self.scratch, self.scap)
        while p < e:
            c = p[0]
            if c == 92:
                if p + 1 >= e:
                    return -1  # the escape would take the closing quote
                c = p[1]
                if c != 34 and c != 92:
                    return -1  # \n, \xNN, ...: the row function unquotes those
                p += 2
            elif c == 34:
                return -1  # an unescaped quote ends the field early
            else:
                p += 1
            self.scratch[k] = c
            k += 1
        return k

    cdef int _channel_payload(self, const unsigned char* ts, Py_ssize_t tslen, const unsigned char* q,
                              const unsigned char* e, unsigned char sep, int64_t number) except -1:
        """``"<channel>"<sep>"<payload>"`` running to the end of the line (MONITOR and --csv)."""
        cdef const unsigned char* c0
        cdef const unsigned char* c1
        cdef Py_ssize_t plen
        cdef int done
        if q >= e or q[0] != 34:
            return 0
        c0 = q + 1
        c1 = c0
        while c1 < e and c1[0] != 34:
            if c1[0] == 92:
                return 0
            c1 += 1
        q = c1 + 1
        if e - q < 3 or q[0] != sep or q[1] != 34 or e[-1] != 34:
            return 0
        plen = self._unquote(q + 2, e - 1)
        if plen <= 0 or not (65 <= self.scratch[0] <= 90):
            return 0
        if ts != NULL:
            self._str(C_TS_TEXT, ts, tslen)
        self._str(C_CHANNEL, c0, c1 - c0)
        done = self._fast(self.scratch, plen, number)
        if not done:
            self._rollback()
        return done

    cdef int _monitor(self, const unsigned char* p, Py_ssize_t n, int64_t number) except -1:
        """``<unix time> [<db> <client>] "PUBLISH" "<channel>" "<payload>"`` (``spark.formats.split_monitor``)."""
        cdef const unsigned char* e = p + n
        cdef const unsigned char* q = p
        cdef const unsigned char* d
        cdef const unsigned char* ts_end
        while q < e and 48 <= q[0] <= 57:
            q += 1
        if q == p:
            return 0
        if q < e and q[0] == 46:
            q += 1
            d = q
            while q < e and 48 <= q[0] <= 57:
                q += 1
            if q == d:
                return 0
        ts_end = q
        if e - q < 2 or q[0] != 32 or q[1] != 91:
            return 0
        q = <const unsigned char*>memchr(q + 2, 93, e - q - 2)
        if q == NULL:
            return 0
        q += 1
        if e - q < 11 or memcmp(q, b' "PUBLISH" ', 11) != 0:
            return 0
        return self._channel_payload(p, ts_end - p, q + 11, e, 32, number)

    cdef int _csv(self, const unsigned char* p, Py_ssize_t n, int64_t number) except -1:
        """``"message","<channel>","<payload>"`` or ``"pmessage","<pattern>",...`` (``spark.formats.split_csv``)."""
        cdef const unsigned char* e = p + n
        cdef const unsigned char* q
        if n > 10 and memcmp(p, b'"message",', 10) == 0:
            q = p + 10
        elif n > 11 and memcmp(p, b'"pmessage","', 12) == 0:
            q = p + 12
            while q < e and q[0] != 34:
                if q[0] == 92:
                    return 0
                q += 1
            if e - q < 2 or q[1] != 44:
                return 0
            q += 2
        else:
            return 0
        return self._channel_payload(NULL, 0, q, e, 44, number)

    cdef int _line(self, const unsigned char* p, Py_ssize_t n, int64_t number, int mode) except -1:
        """Columns of one line in format ``mode``: 1 done, 0 step aside."""
        cdef unsigned char c = p[0]
        if mode == M_LINES:
            if 65 <= c <= 90:
                if _all_ascii(p, n):
                    return self._fast(p, n, number)
            elif (48 <= c <= 57 or c == 60 or c == 62) and _all_ascii(p, n):
                return self._prefixed(p, n, number)
        elif mode == M_MONITOR:
            if 48 <= c <= 57 and _all_ascii(p, n):
                return self._monitor(p, n, number)
        elif mode == M_CSV:
            if c == 34 and _all_ascii(p, n):
                return self._csv(p, n, number)
        return 0

    def feed(self, bytes data not None, Py_ssize_t pos, int64_t number, Py_ssize_t max_rows,
             row_function, str fmt="lines") -> tuple:
        """Add the lines of ``data[pos:]`` until ``max_rows`` rows are held (see the pure twin).

        Also stops early when the batch holds about 1 GiB of text, so
        ``pos < len(data)`` with fewer than ``max_rows`` rows means: take a batch.
        """
        cdef const unsigned char* base = <const unsigned char*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
        cdef const unsigned char* lp
        cdef const unsigned char* nl
        cdef Py_ssize_t ln, lend
        cdef int mode = _MODES.get(fmt, M_OTHER)
        if pos < 0:
            raise ValueError("pos must not be negative")
        while pos < size and self.n < max_rows and self.total < BYTES_LIMIT:
            lp = base + pos
            nl = <const unsigned char*>memchr(lp, 10, size - pos)
            lend = (nl - base) if nl != NULL else size
            ln = lend - pos
            number += 1
            if ln > 0:
                if not self._line(lp, ln, number, mode):
                    values = row_function(number, PyBytes_FromStringAndSize(<const char*>lp, ln))
                    if values is not None:
                        self.append(values)
            pos = lend + 1
        return (pos if pos < size else size), number

    # ------------------------------------------------------------ output

    def take(self) -> list:
        """The held rows as one Arrow array per column (COLUMNS order); the builder is emptied."""
        cdef Py_ssize_t n = self.n
        cdef Py_ssize_t nbytes = (n + 7) // 8
        cdef int k
        cdef Col* c
        import pyarrow as pa

        arrays = []
        for k in range(self.width):
            c = &self.cols[k]
            nulls = n - c.set_count
            validity = pa.py_buffer(PyBytes_FromStringAndSize(<char*>c.valid, nbytes)) if nulls else None
            if c.kind == K_I64:
                arr = pa.Array.from_buffers(
                    pa.int64(), n, [validity, pa.py_buffer(PyBytes_FromStringAndSize(<char*>c.i64, n * 8))], nulls
                )
            elif c.kind == K_BOOL:
                arr = pa.Array.from_buffers(
                    pa.bool_(), n, [validity, pa.py_buffer(PyBytes_FromStringAndSize(<char*>c.bits, nbytes))], nulls
                )
            elif c.kind == K_STR:
                arr = pa.Array.from_buffers(pa.string(), n, [
                    validity,
                    pa.py_buffer(PyBytes_FromStringAndSize(<char*>c.offsets, (n + 1) * 4)),
                    pa.py_buffer(PyBytes_FromStringAndSize(c.data, c.dlen)),
                ], nulls)
            else:
                child = pa.Array.from_buffers(pa.string(), c.cn, [
                    None,
                    pa.py_buffer(PyBytes_FromStringAndSize(<char*>c.coffsets, (c.cn + 1) * 4)),
                    pa.py_buffer(PyBytes_FromStringAndSize(c.data, c.dlen)),
                ], 0)
                arr = pa.Array.from_buffers(
                    pa.list_(pa.string()), n,
                    [validity, pa.py_buffer(PyBytes_FromStringAndSize(<char*>c.offsets, (n + 1) * 4))],
                    nulls, children=[child],
                )
            arrays.append(arr)
        self._reset()
        return arrays

    cdef void _reset(self) noexcept nogil:
        cdef Py_ssize_t nbytes = (self.n + 7) // 8
        cdef int k
        cdef Col* c
        for k in range(self.width):
            c = &self.cols[k]
            memset(c.valid, 0, nbytes)
            if c.kind == K_BOOL:
                memset(c.bits, 0, nbytes)
            c.set_count = 0
            c.dlen = 0
            c.cn = 0
        self.n = 0
        self.total = 0


cdef void* _realloc(void* p, Py_ssize_t n) except NULL:
    cdef void* q = PyMem_Realloc(p, n if n > 0 else 1)
    if q == NULL:
        raise MemoryError()
    return q


# ------------------------------------------------------------- timestamps

cdef int64_t DAY_MICROS = 86400000000


cdef inline bint _dig(unsigned char c) noexcept nogil:
    return 48 <= c <= 57


cdef inline int _num(const unsigned char* p, int n) noexcept nogil:
    cdef int v = 0
    cdef int i
    for i in range(n):
        v = v * 10 + (p[i] - 48)
    return v


cdef int64_t _days_from_civil(int64_t y, int64_t m, int64_t d) noexcept nogil:
    """Days since 1970-01-01 of a proleptic Gregorian date (year >= 1)."""
    y -= m <= 2
    cdef int64_t era = y // 400
    cdef int64_t yoe = y - era * 400
    cdef int64_t doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    cdef int64_t doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


cdef inline int64_t _floor_div(int64_t a, int64_t b) noexcept nogil:
    cdef int64_t q = a // b  # C division (cdivision): truncates toward zero
    if a % b != 0 and (a < 0) != (b < 0):
        q -= 1
    return q


cdef int64_t LOWEST = _days_from_civil(1, 1, 2) * DAY_MICROS
cdef int64_t HIGHEST = _days_from_civil(9999, 12, 30) * DAY_MICROS
cdef int[13] MONTH_DAYS = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


cdef Py_ssize_t _iso_len(const unsigned char* p, const unsigned char* e) noexcept nogil:
    """Length of the ISO-8601 timestamp at ``p`` in the archive prefix's form; 0 if there is none."""
    cdef const unsigned char* q
    cdef int k = 0
    if e - p < 19:
        return 0
    if not (_dig(p[0]) and _dig(p[1]) and _dig(p[2]) and _dig(p[3]) and p[4] == 45 and _dig(p[5]) and _dig(p[6])
            and p[7] == 45 and _dig(p[8]) and _dig(p[9]) and (p[10] == 84 or p[10] == 32) and _dig(p[11])
            and _dig(p[12]) and p[13] == 58 and _dig(p[14]) and _dig(p[15]) and p[16] == 58 and _dig(p[17])
            and _dig(p[18])):
        return 0
    q = p + 19
    if q < e and (q[0] == 46 or q[0] == 44):
        q += 1
        while q < e and _dig(q[0]):
            q += 1
            k += 1
        if k == 0 or k > 9:
            return 0
    if q < e:
        if q[0] == 90:
            q += 1
        elif q[0] == 43 or q[0] == 45:
            if e - q < 5 or not (_dig(q[1]) and _dig(q[2])):
                return 0
            q += 3
            if q[0] == 58:
                q += 1
            if e - q < 2 or not (_dig(q[0]) and _dig(q[1])):
                return 0
            q += 2
    return q - p


cdef int _ts_micros(const unsigned char* p, Py_ssize_t n, int64_t zone_us, int64_t* out) noexcept nogil:
    """Microseconds of one timestamp text (``timestamp_micros``): 1 set, 0 null, -1 not ASCII."""
    cdef Py_ssize_t i = 0, j, k
    cdef int64_t secs = 0, us = 0, v, local
    cdef int digits = 0, year, month, day, hour, minute, second, dim, oh, om
    cdef unsigned char zone
    for j in range(n):
        if p[j] >= 128:
            return -1
    while i < n and _dig(p[i]):
        i += 1
    if i > 0 and (i == n or p[i] == 46):  # unix seconds: DECIMAL(20,6), rounded half up
        if i < n:
            if i + 1 == n:
                return 0
            for k in range(i + 1, n):
                if not _dig(p[k]):
                    return 0
        j = 0
        while j < i and p[j] == 48:
            j += 1
        if i - j > 12:
            return 0  # past 9999-12-30 (or DECIMAL(20,6)) either way
        for k in range(j, i):
            secs = secs * 10 + (p[k] - 48)
        if i < n:
            k = i + 1
            while k < n and digits < 6:
                us = us * 10 + (p[k] - 48)
                k += 1
                digits += 1
            while digits < 6:
                us *= 10
                digits += 1
            if i + 7 < n and p[i + 7] >= 53:
                us += 1
        v = secs * 1000000 + us
    else:
        if n < 19 or _iso_len(p, p + n) != n:
            return 0
        year = _num(p, 4)
        month = _num(p + 5, 2)
        day = _num(p + 8, 2)
        hour = _num(p + 11, 2)
        minute = _num(p + 14, 2)
        second = _num(p + 17, 2)
        i = 19
        if i < n and (p[i] == 46 or p[i] == 44):
            i += 1
            while i < n and _dig(p[i]):
                if digits < 6:
                    us = us * 10 + (p[i] - 48)
                    digits += 1
                i += 1
            while digits < 6:
                us *= 10
                digits += 1
        if year < 1 or month < 1 or month > 12 or day < 1 or hour > 23 or minute > 59 or second > 59:
            return 0
        dim = MONTH_DAYS[month]
        if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
            dim = 29
        if day > dim:
            return 0
        local = _days_from_civil(year, month, day) * DAY_MICROS + ((hour * 60 + minute) * 60 + second) * <int64_t>1000000 + us
        if i == n:
            v = local - zone_us
        elif p[i] == 90:
            v = local
        else:
            oh = _num(p + i + 1, 2)
            om = _num(p + n - 2, 2)
            if om > 59 or oh * 60 + om > 18 * 60:
                return 0
            v = local - (oh * 60 + om) * <int64_t>60000000 if p[i] == 43 else local + (oh * 60 + om) * <int64_t>60000000
    if v < LOWEST or v >= HIGHEST:
        return 0
    out[0] = v
    return 1


def timestamp_columns(ts_text, int64_t offset_seconds, micros_of) -> tuple:
    """(micros since the epoch as int64, session-zone days as int32) of timestamp texts (see the pure twin)."""
    import pyarrow as pa

    cdef Py_ssize_t n = len(ts_text)
    cdef Py_ssize_t off = ts_text.offset
    cdef Py_ssize_t i, j, nulls = 0
    cdef int r
    cdef int64_t v
    cdef int64_t zone_us = offset_seconds * 1000000
    if ts_text.type != pa.string():
        raise TypeError(f"expected a string array, got {ts_text.type}")
    bufs = ts_text.buffers()
    cdef const uint8_t* valid = NULL if bufs[0] is None else <const uint8_t*><size_t>bufs[0].address
    cdef const int32_t* offs = <const int32_t*><size_t>bufs[1].address
    cdef const unsigned char* chars = NULL if bufs[2] is None else <const unsigned char*><size_t>bufs[2].address
    cdef bytes out_valid = PyBytes_FromStringAndSize(NULL, (n + 7) // 8)
    cdef bytes out_micros = PyBytes_FromStringAndSize(NULL, n * 8)
    cdef bytes out_days = PyBytes_FromStringAndSize(NULL, n * 4)
    cdef uint8_t* ov = <uint8_t*>PyBytes_AS_STRING(out_valid)
    cdef int64_t* om = <int64_t*>PyBytes_AS_STRING(out_micros)
    cdef int32_t* od = <int32_t*>PyBytes_AS_STRING(out_days)
    memset(ov, 0, (n + 7) // 8)
    memset(om, 0, n * 8)
    memset(od, 0, n * 4)
    for i in range(n):
        j = i + off
        if valid != NULL and not (valid[j >> 3] >> (j & 7)) & 1:
            nulls += 1
            continue
        r = _ts_micros(chars + offs[j], offs[j + 1] - offs[j], zone_us, &v) if chars != NULL else 0
        if r < 0:
            value = micros_of(PyBytes_FromStringAndSize(<const char*>chars + offs[j], offs[j + 1] - offs[j]).decode())
            if value is None:
                r = 0
            else:
                v = value
                r = 1
        if r == 0:
            nulls += 1
            continue
        ov[i >> 3] |= <uint8_t>(1 << (i & 7))
        om[i] = v
        od[i] = <int32_t>_floor_div(v + zone_us, DAY_MICROS)
    validity = pa.py_buffer(out_valid) if nulls else None
    return (
        pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(out_micros)], nulls),
        pa.Array.from_buffers(pa.int32(), n, [validity, pa.py_buffer(out_days)], nulls),
    )
