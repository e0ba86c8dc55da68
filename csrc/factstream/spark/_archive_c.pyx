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

Size: over 600 lines because ``ArchiveColumns`` is one ``cdef class`` whose
methods all write into the same C buffers, and Cython cannot split a cdef
class across modules without a Python call per line. What is not the class
lives in include files: the JSON/header scanners (``_archive_scan.pxi``) and
the timestamp arithmetic (``_archive_time.pxi``).

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


from .. import _json
from ._archive_py import COLUMNS, HEADER_COLUMNS, RowFunction, _valid_text
from ..commands import COMMAND_MAP

__all__ = ["ArchiveColumns", "COLUMNS", "HEADER_COLUMNS", "RowFunction"]

cdef int MAX_DEPTH = _json.MAX_DEPTH

from factstream._json_scan cimport INT_OK, JSON_MAX_DEPTH, _all_ascii, _int_limit, _is_ws, _json_valid, _parse_i64

if MAX_DEPTH != JSON_MAX_DEPTH:
    raise ImportError(f"factstream._json.MAX_DEPTH {MAX_DEPTH} differs from the compiled scanner's {JSON_MAX_DEPTH}: rebuild")

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


include "_archive_scan.pxi"


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


include "_archive_time.pxi"
