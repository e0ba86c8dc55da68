# cython: language_level=3
"""Compiled twin of the wire codec (see ``factstream._wire_py`` for the specification).

Works on the UTF-8 bytes directly: lines are found with memchr, headers are
sliced without copies, and the row JSON is validated in one pass that also
decides whether the bytes are already in Synapse's canonical encoding. The row
is only built into Python objects when ``RdataCommand.row`` is first read;
with ``rows=True`` it is built at once instead, by a builder that validates
as it builds (one pass; on any doubt the scanner runs and words the error).

Invariants:
- every line handed to ``_parse`` has no newline and is valid UTF-8;
- ``_scan_*`` never read past ``end`` and never allocate;
- the row builder (``fs_build``, C in ``_wire_build.pxi``) only runs on bytes ``_scan_*`` accepted;
  its validating twin (``fs_build_checked``) runs on any bytes of a line already checked as UTF-8.

The JSON scanner is cimported from ``_json_scan.pxd`` (inline functions,
shared with the archive builder). The JSON builder (``_wire_build.pxi``) and
the encoder (``_wire_encode.pxi``) are this module's own code in their own
files, ``include``d so their small functions inline into the parser and the
decoder.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append, PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject, Py_TYPE
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.exc cimport PyErr_Clear
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.long cimport PyLong_FromLongLong, PyLong_FromString
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_AsUTF8AndSize
from libc.stdint cimport int64_t, uint64_t
from libc.math cimport isfinite
from libc.string cimport memchr, memcmp, memcpy, memmove


import json

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
from ._wire_args import check_publish_args, chunk_bytes

__all__ = [
    "parse_line", "encode", "encode_lines", "encode_redis_publish", "LineDecoder", "DEFAULT_MAX_LINE_LENGTH",
    "column_text", "ColumnParams",
]

from factstream._ascii cimport (
    C_0, C_9, C_BACKSLASH, C_BS, C_COLON, C_COMMA, C_CR, C_DOT, C_FF, C_LBRACE, C_LBRACKET, C_LF, C_LOWER_A,
    C_LOWER_B, C_LOWER_E, C_LOWER_F, C_LOWER_N, C_LOWER_R, C_LOWER_T, C_LOWER_U, C_MINUS, C_PLUS, C_QUOTE, C_RBRACE,
    C_RBRACKET, C_SLASH, C_SPACE, C_TAB, C_UPPER_A, C_UPPER_E, C_UPPER_F, C_UPPER_I, C_UPPER_N,
)
from factstream._cpython cimport (
    PyFloat_FromDouble, PyLong_AsLongLongAndOverflow, PyObject_GC_UnTrack, PyOS_string_to_double,
    PyUnicode_4BYTE_KIND, PyUnicode_DATA, PyUnicode_FromKindAndData, PyUnicode_GET_LENGTH, PyUnicode_IS_ASCII,
    PyUnicode_KIND, PyUnicode_New, PyUnicode_READ,
)

DEFAULT_MAX_LINE_LENGTH = 16384

cdef int MAX_DEPTH = _json.MAX_DEPTH
cdef object _dumps = _json.dumps
cdef object _RDATA = RdataCommand
cdef object _POSITION = PositionCommand


include "_slots.pxi"


# ------------------------------------------------------------ freed instances kept for the next
#
# Each row is a command on the writer and a command and one or two typed rows on the reader, each freed
# within a loop turn; allocating one (the collector's bookkeeping, the allocator) and freeing it again
# cost as much as filling it. The deallocator the relay installs on these slot-only classes
# (fs_slots_dealloc) hands an instance here once its slots are cleared and it is out of the collector's
# lists; the next allocation of the same class (fs_alloc_untracked) takes it back, as CPython keeps
# freed floats and tuples. A few hundred per class at most: a burst of frees beyond that is freed.

cdef extern from *:
    r"""
    #define FS_KEPT_TYPES 16
    #define FS_KEPT_MOST 512
    static PyTypeObject *fs_kept_type[FS_KEPT_TYPES];
    static PyObject *fs_kept_obj[FS_KEPT_TYPES][FS_KEPT_MOST];
    static int fs_kept_n[FS_KEPT_TYPES];
    static int fs_kept_types = 0;

    /* o (refcount 0, slots cleared, untracked, an exact registered class) kept for reuse: 1, or 0 when
       its class's list is full (or no list is left for a new class): the caller frees it. The instance
       keeps the reference to its class it held alive. */
    static int fs_kept_keep(PyObject *o) {
        PyTypeObject *t = Py_TYPE(o);
        int i;
        for (i = 0; i < fs_kept_types && fs_kept_type[i] != t; i++)
            ;
        if (i == fs_kept_types) {
            if (fs_kept_types == FS_KEPT_TYPES)
                return 0;
            Py_INCREF(t);  /* the list's class, for the life of the process */
            fs_kept_type[fs_kept_types++] = t;
        }
        if (fs_kept_n[i] == FS_KEPT_MOST)
            return 0;
        fs_kept_obj[i][fs_kept_n[i]++] = o;
        return 1;
    }

    /* A kept instance of exactly t, alive again (refcount 1, every slot NULL, untracked), or NULL. */
    static PyObject *fs_kept_take(PyTypeObject *t) {
        PyObject *o;
        int i;
        for (i = 0; i < fs_kept_types && fs_kept_type[i] != t; i++)
            ;
        if (i == fs_kept_types || fs_kept_n[i] == 0)
            return NULL;
        o = fs_kept_obj[i][--fs_kept_n[i]];
        PyObject_Init(o, t);  /* refcount 1 and a new reference to t... */
        Py_DECREF(t);         /* ...for the one it kept from its last life */
        return o;
    }
    """
    PyObject* fs_kept_take(_SlotTypeObject* t)
    int fs_kept_keep(PyObject* o)


cdef void* kept_take_fn() noexcept:
    return <void*>fs_kept_take


cdef void* kept_keep_fn() noexcept:
    return <void*>fs_kept_keep


fs_kept_set(<void*>fs_kept_take, <void*>fs_kept_keep)

cdef Py_ssize_t P_STREAM = _slot(PositionCommand, "stream_name")
cdef Py_ssize_t P_INSTANCE = _slot(PositionCommand, "instance_name")
cdef Py_ssize_t P_PREV = _slot(PositionCommand, "prev_token")
cdef Py_ssize_t P_NEW = _slot(PositionCommand, "new_token")
cdef object S_DATA_CLASS = COMMAND_MAP["PING"].__mro__[1]
cdef Py_ssize_t S_DATA = _slot(S_DATA_CLASS, "data")

from factstream._json_scan cimport (
    ERR_DEPTH, INT_OK, INT_OVERFLOW, JSON_MAX_DEPTH, Scan, _SWAR_HIGH, _all_ascii, _error_text,
    _first_flagged, _hexval, _int_limit, _is_ws, _load8, _number_tail, _parse_i64, _quote_or_backslash8,
    _HAVE_SSE2, _scan_document, _string_special8,
)

#: Whether this build scans sixteen bytes at a time (SSE2); the build switch FACTSTREAM_NO_SIMD=1 turns it
#: off, which is how tests/test_wire_portable.py runs the codec's tests on the portable path.
_SIMD = bool(_HAVE_SSE2)

if MAX_DEPTH != JSON_MAX_DEPTH:
    raise ImportError(f"factstream._json.MAX_DEPTH {MAX_DEPTH} differs from the compiled scanner's {JSON_MAX_DEPTH}: rebuild")


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
            value = decode_row(<object>loads, <object>raw)  # our own builder in C, without a Python call
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

cdef extern from *:
    r"""
    /* A field's text: valid UTF-8 (the line was checked); ASCII, the usual
       case, is copied into the str without going through the decoder. */
    static PyObject *fs_text(const unsigned char *p, Py_ssize_t n) {
        Py_ssize_t i = 0;
        uint64_t acc = 0, w;
        unsigned char tail = 0;
        PyObject *text;
        for (; i + 8 <= n; i += 8) {
            memcpy(&w, p + i, 8);
            acc |= w;
        }
        for (; i < n; i++)
            tail |= p[i];
        if ((acc & 0x8080808080808080ULL) || (tail & 0x80))
            return PyUnicode_DecodeUTF8((const char *)p, n, NULL);
        text = PyUnicode_New(n, 127);
        if (text != NULL)
            memcpy(PyUnicode_DATA(text), p, (size_t)n);
        return text;
    }

    /* Stream and instance names repeat on every line: the last decoded names
       are kept, keyed by their bytes (the first and the last eight, which
       for up to sixteen bytes are all of them, and the rest when longer), and
       shared (str is immutable). Two ways per set: two names whose hashes
       meet both stay. */
    #define FS_NAME_SETS 64   /* a power of two */
    #define FS_NAME_MAX 40
    typedef struct {
        uint64_t w0, w1;
        Py_ssize_t n;
        PyObject *s;
        unsigned char bytes[FS_NAME_MAX];
    } fs_nameslot;
    static fs_nameslot fs_names[FS_NAME_SETS][2];
    static unsigned char fs_name_victim[FS_NAME_SETS];

    static inline int fs_name_is(const fs_nameslot *slot, const unsigned char *p, Py_ssize_t n, uint64_t w0,
                                 uint64_t w1) {
        return slot->s != NULL && slot->n == n && slot->w0 == w0 && slot->w1 == w1
               && (n <= 16 || memcmp(slot->bytes + 8, p + 8, (size_t)(n - 16)) == 0);
    }

    /* The str of p[:n] (0 < n), a new reference; NULL with an exception set. */
    static PyObject *fs_name(const unsigned char *p, Py_ssize_t n) {
        uint64_t w0 = 0, w1 = 0;
        fs_nameslot *set, *slot;
        unsigned int h;
        PyObject *s;
        Py_ssize_t i;
        if (n > FS_NAME_MAX)
            return fs_text(p, n);
        if (n >= 8) {
            memcpy(&w0, p, 8);
            memcpy(&w1, p + n - 8, 8);
        } else if (n >= 4) {  /* the first four and the last four: every byte */
            uint32_t a, z;
            memcpy(&a, p, 4);
            memcpy(&z, p + n - 4, 4);
            w0 = (uint64_t)a | ((uint64_t)z << 32);
        } else {
            for (i = 0; i < n; i++)
                w0 |= (uint64_t)p[i] << (8 * i);
        }
        h = (unsigned int)(((w0 * 0x9E3779B97F4A7C15ULL) ^ (w1 * 0xC2B2AE3D27D4EB4FULL) ^ (uint64_t)n) >> 58);
        set = fs_names[h];
        if (fs_name_is(&set[0], p, n, w0, w1)) {
            Py_INCREF(set[0].s);
            return set[0].s;
        }
        if (fs_name_is(&set[1], p, n, w0, w1)) {
            Py_INCREF(set[1].s);
            return set[1].s;
        }
        s = fs_text(p, n);
        if (s == NULL)
            return NULL;
        slot = &set[fs_name_victim[h]];  /* the two ways are replaced in turn */
        fs_name_victim[h] ^= 1;
        Py_INCREF(s);
        Py_XSETREF(slot->s, s);
        slot->w0 = w0;
        slot->w1 = w1;
        slot->n = n;
        memcpy(slot->bytes, p, (size_t)n);
        return s;
    }
    """
    object fs_text(const unsigned char* p, Py_ssize_t n)
    object fs_name(const unsigned char* p, Py_ssize_t n)


cdef inline object _name(const unsigned char* p, Py_ssize_t n, str what, object line):
    if n == 0:
        raise ProtocolError(f"{what} is empty", line)
    return fs_name(p, n)


cdef int _scan_json(const unsigned char* p, Py_ssize_t n, bint* canonical, str what, object line) except -1:
    """Validate one JSON document; sets ``canonical``; raises ProtocolError."""
    cdef Scan s
    cdef const unsigned char* q = _scan_document(&s, p, n, 640 if n <= 640 else _int_limit())
    if q == NULL:
        if s.err == ERR_DEPTH:
            msg = f"JSON nested deeper than {MAX_DEPTH} levels"
        else:
            msg = f"{_error_text(s.err).decode()} at char {s.err_at}"
        raise ProtocolError(f"{what} is not valid JSON ({msg})", line)
    canonical[0] = s.canonical
    return 0


include "_wire_build.pxi"


# -------------------------------------------------------------- line parsing

cdef extern from *:
    """
    /* Strict UTF-8 as CPython's decoder takes it (no overlong forms, no
       surrogates, nothing past U+10FFFF), without building the str: 1 when
       valid. Only a yes is trusted; a no is confirmed by the decoder, which
       also words the error. */
    static int fs_utf8_valid(const unsigned char *p, Py_ssize_t n) {
        const unsigned char *end = p + n;
        while (p < end) {
            unsigned char c = *p;
            if (c < 0x80) {
                uint64_t w;
                if (end - p >= 8) {
                    memcpy(&w, p, 8);
                    if (!(w & 0x8080808080808080ULL)) {
                        p += 8;
                        continue;
                    }
                }
                p++;
                continue;
            }
            if (c >= 0xC2 && c <= 0xDF) {
                if (end - p < 2 || (p[1] & 0xC0) != 0x80)
                    return 0;
                p += 2;
            } else if (c >= 0xE0 && c <= 0xEF) {
                unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
                if (end - p < 3 || p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80)
                    return 0;
                p += 3;
            } else if (c >= 0xF0 && c <= 0xF4) {
                unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
                if (end - p < 4 || p[1] < lo || p[1] > hi || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
                    return 0;
                p += 4;
            } else {
                return 0;
            }
        }
        return 1;
    }
    """
    bint _utf8_valid "fs_utf8_valid"(const unsigned char* p, Py_ssize_t n) noexcept nogil


cdef extern from *:
    """
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
    #include <emmintrin.h>
    #endif
    /* The one line scanner, for parse_line (one line, which must hold no
       newline) and for the decoder (a buffer, cut at its newlines): from p,
       a newline before end (NULL when there is none), and in the same pass
       what the bytes before it tell: *flags is FS_NON_ASCII when one of
       them is not ASCII, and sp[0..FS_SPACES) their first spaces (NULL past
       the last), at which the command name and the fields before an RDATA
       row (or the five of a USER_SYNC) end, so no field is searched for a
       second time and no line is read twice before it is parsed.
       With `first` (the decoder) the newline is the first one and the bytes
       told of are those before it; without (parse_line, where a newline is
       an error) the whole range is read without stopping, and what is
       returned is only NULL or not (a newline in it, not where). `first` is a constant at each call: the compiler
       makes one loop of each. */
    #define FS_SPACES 5
    #define FS_NON_ASCII 2
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
    /* Sixteen bytes at q, of which those under `fresh` (a bit mask) are not
       yet seen. With `first`: 1 when one of them is a newline (*nl set to
       the first); without, their newlines are added to *lfs. */
    static inline int fs_line_block(const unsigned char *q, unsigned int fresh, const int first,
                                    const unsigned char **sp, int *k, unsigned int *hi, unsigned int *lfs,
                                    const unsigned char **nl) {
        const __m128i v = _mm_loadu_si128((const __m128i *)q);
        /* Without `first` a byte seen twice counts as once: only the spaces need `fresh`. */
        unsigned int lf = (unsigned int)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(10))) & (first ? fresh : 0xFFFFu);
        unsigned int keep = fresh;
        if (first && lf)
            keep &= (1u << __builtin_ctz(lf)) - 1;  /* the bytes before it */
        *hi |= (unsigned int)_mm_movemask_epi8(v) & (first ? keep : 0xFFFFu);
        if (*k < FS_SPACES) {
            unsigned int m = (unsigned int)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(32))) & keep;
            while (m && *k < FS_SPACES) {
                sp[(*k)++] = q + __builtin_ctz(m);
                m &= m - 1;
            }
        }
        if (!first) {
            *lfs |= lf;
            return 0;
        }
        if (lf) {
            *nl = q + __builtin_ctz(lf);
            return 1;
        }
        return 0;
    }
    #endif
    static inline const unsigned char *fs_line_scan(const unsigned char *p, const unsigned char *end, const int first,
                                                    const unsigned char **sp, int *flags) {
        const unsigned char *q = p, *nl = NULL;
        unsigned int hi = 0, lfs = 0;
        int k;
        for (k = 0; k < FS_SPACES; k++)
            sp[k] = NULL;
        k = 0;
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
        while (end - q >= 16) {
            if (fs_line_block(q, 0xFFFFu, first, sp, &k, &hi, &lfs, &nl))
                goto done;
            q += 16;
        }
        if (q < end && end - p >= 16) {  /* the tail: the last sixteen bytes, those already seen masked off */
            if (fs_line_block(end - 16, 0xFFFFu << (q - (end - 16)), first, sp, &k, &hi, &lfs, &nl))
                goto done;
            q = end;
        }
        if (lfs)
            nl = p;  /* not a position: a line holding a newline is refused wherever it is */
    #endif
        while (q < end) {
            if (*q == 10) {
                nl = q;
                if (first)
                    goto done;
            }
            hi |= *q & 0x80;
            if (*q == 32 && k < FS_SPACES)
                sp[k++] = q;
            q++;
        }
    done:
        *flags = hi ? FS_NON_ASCII : 0;
        return nl;
    }
    static inline const unsigned char *fs_line_next(const unsigned char *p, const unsigned char *end,
                                                    const unsigned char **sp, int *flags) {
        return fs_line_scan(p, end, 1, sp, flags);
    }
    static inline const unsigned char *fs_line_whole(const unsigned char *p, const unsigned char *end,
                                                     const unsigned char **sp, int *flags) {
        return fs_line_scan(p, end, 0, sp, flags);
    }
    """
    const unsigned char* _line_next "fs_line_next"(const unsigned char* p, const unsigned char* end,
                                                   const unsigned char** sp, int* flags) noexcept nogil
    const unsigned char* _line_whole "fs_line_whole"(const unsigned char* p, const unsigned char* end,
                                                     const unsigned char** sp, int* flags) noexcept nogil
    enum: FS_SPACES
    enum: LINE_NON_ASCII "FS_NON_ASCII"


cdef inline str _text(const unsigned char* p, Py_ssize_t n):
    return fs_text(p, n)


cdef inline object _word(const unsigned char* p, Py_ssize_t n, str what, object line):
    if n == 0:
        raise ProtocolError(f"{what} is empty", line)
    return fs_text(p, n)


cdef object _int_field(const unsigned char* p, Py_ssize_t n, str what, object line):
    """ASCII digits with an optional leading '-', fitting a signed 64-bit int."""
    cdef long long v = 0
    cdef Py_ssize_t i
    cdef unsigned int d
    cdef int status
    if 0 < n <= 18:  # the usual token: up to 18 digits cannot overflow
        for i in range(n):
            d = p[i] - 48
            if d > 9:
                break
            v = v * 10 + d
        else:
            return PyLong_FromLongLong(v)
    status = _parse_i64(p, n, &v)
    if status == INT_OK:
        return PyLong_FromLongLong(v)
    if status == INT_OVERFLOW:
        raise ProtocolError(f"{what} {_text(p, n)!r} does not fit in 64 bits", line)
    raise ProtocolError(f"{what} {_text(p, n)!r} is not an integer", line)


cdef inline const unsigned char* _space(const unsigned char* p, const unsigned char* end) noexcept:
    # The fields before a row are short: a byte loop beats a call to memchr.
    while p < end:
        if p[0] == 32:
            return p
        p += 1
    return NULL


cdef object _parse_rdata(const unsigned char* p, const unsigned char** sp, const unsigned char* end, object line,
                        bint rows):
    # sp: the first three spaces after the command name (NULL past the line's last)
    cdef const unsigned char* s1 = sp[0]
    cdef const unsigned char* s2 = sp[1]
    cdef const unsigned char* s3 = sp[2]
    cdef bint canonical
    cdef object cmd, token
    if s1 != NULL:
        if s2 != NULL:
            if s3 != NULL:
                stream = _name(p, s1 - p, "stream_name", line)
                instance = _name(s1 + 1, s2 - s1 - 1, "instance_name", line)
                if s3 - s2 - 1 == 5 and memcmp(s2 + 1, b"batch", 5) == 0:
                    token = None
                else:
                    token = _int_field(s2 + 1, s3 - s2 - 1, "token", line)
                if rows:
                    # Built while validated, as a command whose row was read: no bytes kept.
                    value = _BUILDER.build_checked(s3 + 1, end - s3 - 1, line)
                    cmd = _rdata_new(stream, instance, token, value, None, False, None)
                    if PyObject_IS_GC(<PyObject*>value):  # else atomic slots only: stays untracked
                        if not fs_hold_born(&_BUILDER.b, <PyObject*>cmd):  # held untracked with its row during a feed
                            _track_new(cmd)
                    return cmd
                _scan_json(s3 + 1, end - s3 - 1, &canonical, "row", line)
                # atomic slots only: born untracked, see _track_if_holding
                return _rdata_new(stream, instance, token, _UNSET_ROW,
                                  PyBytes_FromStringAndSize(<const char*>s3 + 1, end - s3 - 1),
                                  True if canonical else False, _loads_row)
    raise ProtocolError("expected RDATA <stream_name> <instance_name> <token> <row_json>", line)


cdef object _parse_position(const unsigned char* p, const unsigned char** sp, const unsigned char* end, object line):
    # sp: the first three spaces after the command name (NULL past the line's last)
    cdef const unsigned char* s1 = sp[0]
    cdef const unsigned char* s2 = sp[1]
    cdef const unsigned char* s3 = sp[2]
    cdef object cmd
    if s1 != NULL:
        if s2 != NULL:
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


cdef object _parse_user_sync(const unsigned char* p, const unsigned char** s, const unsigned char* end, object line):
    # s: the first four spaces after the command name (NULL past the line's last)
    cdef int i
    for i in range(4):
        if s[i] == NULL:
            raise ProtocolError(
                "expected USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>", line
            )
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
    fields = _BUILDER.build_checked(s1 + 1, end - s1 - 1, line, "USER_IP fields")
    if type(fields) is not list or len(fields) != 5:
        raise ProtocolError(
            "USER_IP fields must be a JSON array [access_token, ip, user_agent, device_id, last_seen]", line
        )
    return UserIpCommand(_word(p, s1 - p, "user_id", line), *fields)


cdef object _parse_lock_released(const unsigned char* p, const unsigned char* end, object line):
    fields = _BUILDER.build_checked(p, end - p, line, "LOCK_RELEASED fields")
    if type(fields) is not list or len(fields) != 3:
        raise ProtocolError("LOCK_RELEASED body must be a JSON array [instance_name, lock_name, lock_key]", line)
    return LockReleasedCommand(*fields)


cdef dict _SIMPLE = {
    name.encode(): cls
    for name, cls in COMMAND_MAP.items()
    if name not in ("RDATA", "POSITION", "USER_SYNC", "FEDERATION_ACK", "USER_IP", "LOCK_RELEASED", "REPLICATE")
}


cdef object _parse(const unsigned char* p, Py_ssize_t n, object line, bint rows):
    """Parse one line (no newline); ``line`` is what error messages show; ``rows``: decode an RDATA row now."""
    cdef const unsigned char* spaces[FS_SPACES]
    cdef int flags
    if _line_whole(p, p + n, spaces, &flags) != NULL:  # also: non-ASCII, the first spaces
        raise ProtocolError("line contains a newline", line)
    return _parse_scanned(p, n, line, rows, flags, spaces)


cdef inline object _parse_scanned(const unsigned char* p, Py_ssize_t n, object line, bint rows, int flags,
                           const unsigned char** spaces):
    """``_parse`` of a line already scanned: no newline, ``flags`` and ``spaces`` as ``fs_line_next`` gives them."""
    cdef const unsigned char* end = p + n
    cdef const unsigned char* sp
    cdef const unsigned char* body
    cdef Py_ssize_t nlen
    if flags & LINE_NON_ASCII and not _utf8_valid(p, n):
        try:
            PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
        except UnicodeDecodeError as err:
            raise ProtocolError(f"line is not valid UTF-8 ({err.reason} at byte {err.start})", line) from None
    sp = spaces[0]
    if sp == NULL:
        nlen = n
        body = end
    else:
        nlen = sp - p
        body = sp + 1
    # Dispatch on length first: cheap and unambiguous for the hot commands.
    if nlen == 5 and memcmp(p, b"RDATA", 5) == 0:
        return _parse_rdata(body, &spaces[1], end, line, rows)
    if nlen == 8 and memcmp(p, b"POSITION", 8) == 0:
        return _parse_position(body, &spaces[1], end, line)
    if nlen == 4 and memcmp(p, b"PING", 4) == 0:
        return _simple_cmd(_PING, body, end)
    if nlen == 9 and memcmp(p, b"USER_SYNC", 9) == 0:
        return _parse_user_sync(body, &spaces[1], end, line)
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


def parse_line(line, *, rows=False) -> Command:
    """Parse one replication line (without its newline; one trailing ``\\n`` is allowed).

    With ``rows=True`` an RDATA row is decoded at once (in the same pass that
    validates it) rather than on first read of ``.row``. Raises
    :class:`ProtocolError` for anything that is not a valid command.
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
    return _parse(<const unsigned char*>PyBytes_AS_STRING(data), n, line, rows)


# The common call, ``parse_line(line)`` or ``parse_line(line, rows=True)`` with
# bytes, goes through a C function of the interpreter's fastest calling
# convention rather than a Cython def: that one's argument handling cost
# about as much as reading a PING line. Anything else (str, a keyword given
# by name, rows not a bool, a trailing newline) is handed to the def above,
# which stays the one definition of the behaviour.

cdef extern from *:
    r"""
    typedef PyObject *(*fs_parse_fn)(const unsigned char *, Py_ssize_t, PyObject *, int);
    static PyObject *fs_pl_general, *fs_pl_rows_name;
    static fs_parse_fn fs_pl_parse;
    static char *fs_pl_doc;

    static PyObject *fs_parse_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
        PyObject *line;
        Py_ssize_t n;
        int rows = 0;
        (void)self;
        if (nargs != 1 || !PyBytes_CheckExact(args[0]))
            goto general;
        if (kwnames != NULL) {
            if (PyTuple_GET_SIZE(kwnames) != 1 || PyTuple_GET_ITEM(kwnames, 0) != fs_pl_rows_name)
                goto general;
            if (args[1] == Py_True)
                rows = 1;
            else if (args[1] != Py_False)
                goto general;
        }
        line = args[0];
        n = PyBytes_GET_SIZE(line);
        if (n && PyBytes_AS_STRING(line)[n - 1] == '\n')
            goto general;
        return fs_pl_parse((const unsigned char *)PyBytes_AS_STRING(line), n, line, rows);
    general:
        return PyObject_Vectorcall(fs_pl_general, args, (size_t)nargs, kwnames);
    }

    static PyMethodDef fs_pl_def = {"parse_line", (PyCFunction)(void (*)(void))fs_parse_line,
                                    METH_FASTCALL | METH_KEYWORDS, NULL};

    /* The function object; general: the def, doc: its docstring without the signature line. */
    static PyObject *fs_parse_line_new(PyObject *general, fs_parse_fn parse, PyObject *module_name, const char *doc) {
        static const char head[] = "parse_line(line, *, rows=False)\n--\n\n";
        if (fs_pl_general == NULL) {
            fs_pl_rows_name = PyUnicode_InternFromString("rows");
            if (fs_pl_rows_name == NULL)
                return NULL;
            fs_pl_doc = (char *)PyMem_RawMalloc(sizeof(head) + strlen(doc));
            if (fs_pl_doc == NULL)
                return PyErr_NoMemory();
            memcpy(fs_pl_doc, head, sizeof(head) - 1);
            strcpy(fs_pl_doc + sizeof(head) - 1, doc);
            fs_pl_def.ml_doc = fs_pl_doc;
            Py_INCREF(general);
            fs_pl_general = general;
            fs_pl_parse = parse;
        }
        return PyCFunction_NewEx(&fs_pl_def, NULL, module_name);
    }
    """
    ctypedef object (*fs_parse_fn)(const unsigned char*, Py_ssize_t, object, bint)
    object fs_parse_line_new(object general, fs_parse_fn parse, object module_name, const char* doc)


cdef bytes _PARSE_LINE_DOC = parse_line.__doc__.split("\n\n", 1)[1].encode()
parse_line = fs_parse_line_new(parse_line, _parse, __name__, _PARSE_LINE_DOC)


include "_wire_encode.pxi"


# ------------------------------------------------------------------- decoder

cdef inline bint _blank(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    # bytes.strip() whitespace: space, \t, \n, \r, \v, \f
    cdef Py_ssize_t i
    for i in range(n):
        if not (p[i] == C_SPACE or C_TAB <= p[i] <= C_CR):
            return False
    return True


cdef enum:
    HOLD_MIN_BYTES = 16384  # a feed's piece from which its rows are held out of the collector (see feed)
    WINDOW_BYTES = 32768  # iter_feed builds the commands of about this many bytes at a time (see iter_feed)


cdef class LineDecoder:
    """Incremental decoder: feed bytes as they arrive, get completed commands.

    Partial lines are held across calls; blank lines are ignored. A line
    longer than ``max_line_length`` bytes is refused (and skipped up to its
    newline). When a line is bad, ``feed`` raises :class:`ProtocolError` whose
    ``commands`` holds the commands completed before it; the bytes after the
    bad line stay buffered and come out of the next ``feed`` (``feed(b"")``
    continues without new data). ``rows=True`` decodes RDATA rows as the
    lines are parsed (as ``parse_line(..., rows=True)``).

    ``iter_feed`` is ``feed`` for big buffers: the same commands, built about
    32 KiB of lines at a time as they are taken, so a caller that handles and
    drops each never holds a whole file's commands at once.
    """

    cdef char* buf
    cdef Py_ssize_t len
    cdef Py_ssize_t cap
    cdef bint discarding
    cdef readonly Py_ssize_t max_line_length
    cdef readonly bint rows
    # iter_feed's state, held here so that every command comes out once, in order, whoever takes it next:
    cdef bytes pending  # bytes given to iter_feed and not parsed yet (from pending_at); None when none
    cdef Py_ssize_t pending_at
    cdef list ready  # commands built and not taken yet (from ready_at); None when none
    cdef Py_ssize_t ready_at
    cdef object deferred  # the ProtocolError of a bad line, raised once the commands before it are taken

    def __cinit__(self, Py_ssize_t max_line_length=DEFAULT_MAX_LINE_LENGTH, *, bint rows=False):
        if max_line_length < 1:
            raise ValueError("max_line_length must be positive")
        self.max_line_length = max_line_length
        self.rows = rows
        self.buf = NULL
        self.len = 0
        self.cap = 0
        self.discarding = False
        self.pending = None
        self.ready = None
        self.deferred = None

    def __dealloc__(self):
        if self.buf != NULL:
            PyMem_Free(self.buf)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete line (and, during ``iter_feed``, the bytes not parsed yet)."""
        if self.pending is not None:
            return self.len + PyBytes_GET_SIZE(self.pending) - self.pending_at
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

    cdef int _keep_more(self, const char* data, Py_ssize_t n) except -1:
        # Append data[:n] to the buffer (data does not alias it).
        cdef char* nb
        if self.len + n > self.cap:
            nb = <char*>PyMem_Realloc(self.buf, self.len + n)
            if nb == NULL:
                raise MemoryError()
            self.buf = nb
            self.cap = self.len + n
        memcpy(self.buf + self.len, data, n)
        self.len += n
        return 0

    cdef int _lines(self, const char* p, Py_ssize_t n, Py_ssize_t* at, list out) except -1:
        """Parse the complete lines of ``p[at:n]`` into ``out``, moving ``at`` past each.

        Returns 0 when no complete line is left and 1 when the line at ``at``
        is too long; a bad line raises with ``at`` still at its start. One
        call for all the lines of a chunk: no exception frame per line.
        """
        cdef const char* nl
        cdef Py_ssize_t ln
        cdef object cmd
        cdef Py_ssize_t start = at[0]
        cdef Py_ssize_t limit = self.max_line_length
        cdef const unsigned char* spaces[FS_SPACES]
        cdef int flags
        while True:
            nl = <const char*>_line_next(<const unsigned char*>p + start, <const unsigned char*>p + n, spaces, &flags)
            if nl == NULL:
                at[0] = start
                return 0
            ln = (nl - p) - start
            if self.discarding:  # the tail of a line already reported as too long
                self.discarding = False
                start += ln + 1
                continue
            if ln > limit:
                at[0] = start
                return 1
            if not _blank(<const unsigned char*>p + start, ln):
                at[0] = start
                cmd = _parse_scanned(<const unsigned char*>p + start, ln, None, self.rows, flags, spaces)
                if type(cmd) is not _RDATA and type(cmd) is not _POSITION:  # those two are held or untracked already
                    fs_hold(&_BUILDER.b, <PyObject*>cmd)  # a tracked command (PING, USER_SYNC...): held as its row
                out.append(cmd)
            start += ln + 1

    def feed(self, data) -> list:
        """The commands completed by ``data`` (see the class docstring for errors)."""
        if type(data) is not bytes:
            data = chunk_bytes(data)
        if self.pending is not None or self.ready is not None or self.deferred is not None:
            return self._feed_after_iter(<bytes>data)
        return self._feed_held(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))

    def iter_feed(self, data):
        """The commands completed by ``data``, as ``feed`` gives them, built as they are taken.

        A whole file's buffer costs per line no more than 64 KiB pieces of it
        cost when each command is dropped after use: only a small window of
        commands (small enough to stay in the cache) is built ahead of the
        caller. At a bad line the iterator first gives
        every command before it, then raises :class:`ProtocolError` (its
        ``commands`` empty) and ends; the bytes after the bad line stay
        buffered, as with ``feed``. What is not taken yet stays with the
        decoder: the next ``feed`` or iterator gives it first.
        """
        if type(data) is not bytes:
            data = chunk_bytes(data, "iter_feed")
        if self.pending is not None:
            self.pending = PyBytes_FromStringAndSize(
                PyBytes_AS_STRING(self.pending) + self.pending_at, PyBytes_GET_SIZE(self.pending) - self.pending_at
            ) + <bytes>data
        else:
            self.pending = <bytes>data
        self.pending_at = 0
        cdef _Commands it = _Commands.__new__(_Commands)
        it.dec = self
        return it

    cdef list _feed_held(self, const char* p, Py_ssize_t n):
        # Commands and rows built during this feed stay out of the cycle
        # collector's lists until it ends (fs_hold in _wire_build.pxi): the
        # young collections the feed's own allocations trigger then have
        # nothing of it to walk.
        # A small piece is not held: its few hundred containers trigger no
        # collection of their own before the caller drops them, and holding
        # (untrack, keep, track again) would be all cost.
        if self.len + n < HOLD_MIN_BYTES:
            return self._feed(p, n)
        _BUILDER.b.defer += 1
        try:
            return self._feed(p, n)
        finally:
            _BUILDER.b.defer -= 1
            fs_release(&_BUILDER.b)

    cdef list _feed_after_iter(self, bytes data):
        # What an iterator left comes first: its built commands, its bad line, its unparsed bytes.
        cdef list out = self.ready[self.ready_at:] if self.ready is not None else []
        cdef object err = self.deferred
        cdef bytes rest = self._take_pending()
        self.ready = None
        self.deferred = None
        rest = rest + data if rest else data
        if err is not None:
            if rest:  # behind the bad line: kept for the next feed
                self.pending = rest
                self.pending_at = 0
            err.commands = out
            raise err
        try:
            out.extend(self._feed_held(PyBytes_AS_STRING(rest), PyBytes_GET_SIZE(rest)))
        except ProtocolError as err2:
            err2.commands = out + err2.commands
            raise
        return out

    cdef bytes _take_pending(self):
        cdef bytes data = self.pending
        self.pending = None
        if data is None:
            return b""
        if self.pending_at == 0:
            return data
        return PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + self.pending_at,
                                         PyBytes_GET_SIZE(data) - self.pending_at)

    cdef object _next(self):
        """The next command for an iterator, or NULL (no exception) when none is left."""
        cdef object cmd, err
        while True:
            if self.ready is not None:
                if self.ready_at < PyList_GET_SIZE(self.ready):
                    cmd = <object>PyList_GET_ITEM(self.ready, self.ready_at)
                    self.ready_at += 1
                    return cmd
                self.ready = None
            if self.deferred is not None:
                err = self.deferred
                self.deferred = None
                err.commands = []
                raise err
            if self.pending is None:
                return None
            self._window()

    cdef int _window(self) except -1:
        # Parse the next WINDOW_BYTES (to a line's end) of the pending bytes into ready.
        cdef bytes data = self.pending
        cdef const char* p = PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t at = self.pending_at
        cdef Py_ssize_t end = n
        cdef const char* nl
        if n - at > WINDOW_BYTES:
            nl = <const char*>memchr(p + at + WINDOW_BYTES, 10, n - at - WINDOW_BYTES)
            if nl != NULL:
                end = nl - p + 1
        if end == n:
            self.pending = None
        else:
            self.pending_at = end
        self.ready_at = 0
        try:
            self.ready = self._feed_held(p + at, end - at)
        except ProtocolError as err:
            self.ready = err.commands
            self.deferred = err
        return 0

    cdef list _feed(self, const char* p, Py_ssize_t n):
        cdef bytes head
        cdef const char* nl
        cdef Py_ssize_t ln
        cdef list out = []
        if self.len:
            nl = <const char*>memchr(p, 10, n)
            if nl == NULL:  # the held line goes on
                ln = n
            else:  # the held line ends in p: only it is joined, the rest is read where it is.
                ln = nl - p + 1
            head = PyBytes_FromStringAndSize(NULL, self.len + ln)
            memcpy(PyBytes_AS_STRING(head), self.buf, self.len)
            memcpy(PyBytes_AS_STRING(head) + self.len, p, ln)
            self.len = 0
            if nl == NULL:
                return self._complete(PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head), 0, out)
            try:
                self._complete(PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head), 0, out)  # complete lines only
            except ProtocolError:
                # what follows the bad line stays buffered, as in any piece: the rest of the head (lines held
                # after an earlier bad line), then the rest of p
                self._keep_more(p + ln, n - ln)
                raise
            return self._complete(p, n, ln, out)
        return self._complete(p, n, 0, out)

    cdef list _complete(self, const char* p, Py_ssize_t n, Py_ssize_t start, list out):
        """Parse the complete lines of ``p[start:n]`` into ``out``; keep (or refuse) the partial tail."""
        cdef Py_ssize_t ln
        cdef const char* nl
        cdef Py_ssize_t limit = self.max_line_length
        cdef int too_long
        try:
            too_long = self._lines(p, n, &start, out)
        except ProtocolError as err:
            nl = <const char*>memchr(p + start, 10, n - start)  # the bad line is complete
            ln = (nl - p) - start
            line = PyBytes_FromStringAndSize(p + start, ln)
            start += ln + 1
            self._keep(p + start, n - start)
            err2 = ProtocolError(err.reason, line)
            err2.commands = out
            raise err2 from None
        if too_long:
            nl = <const char*>memchr(p + start, 10, n - start)
            ln = (nl - p) - start
            line = PyBytes_FromStringAndSize(p + start, ln)
            start += ln + 1
            self._keep(p + start, n - start)
            err = ProtocolError(f"line longer than {limit} bytes", line)
            err.commands = out
            raise err
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


cdef class _Commands:
    """The iterator ``LineDecoder.iter_feed`` returns: takes the decoder's next command."""

    cdef LineDecoder dec

    def __iter__(self):
        return self

    def __next__(self):
        cdef LineDecoder dec = self.dec
        # The common case inline, holding no reference to the window: _next drops it before building the next.
        if dec.ready is not None and dec.ready_at < PyList_GET_SIZE(dec.ready):
            dec.ready_at += 1
            return <object>PyList_GET_ITEM(dec.ready, dec.ready_at - 1)
        cmd = dec._next()
        if cmd is None:
            raise StopIteration
        return cmd


include "_wire_rows.pxi"
