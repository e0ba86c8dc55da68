# The JSON scanner and the protocol's integer grammar, shared by the compiled
# modules that read JSON: ``from factstream._json_scan cimport ...``.
#
# Declarations with their bodies: every function here is ``cdef inline``, so
# each module that cimports one compiles its own copy, which the C compiler
# inlines into that module's hot loops (a call across extension modules
# would go through a function pointer table instead, for every value). It
# allocates nothing and never reads past ``end``.

from libc.stdint cimport uint64_t
from libc.string cimport memcmp, memcpy

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


# ------------------------------------------------------------------ JSON scan
#
# The scanner mirrors CPython's json decoder (the C scanner Synapse runs on):
# same grammar, same whitespace set, NaN/Infinity refused (Synapse's
# parse_constant), \uXXXX surrogate pairs joined, control characters refused
# in strings. It also tracks whether re-encoding the decoded value with
# Synapse's encoder would give back exactly these bytes ("canonical").

cdef enum:
    ERR_NONE = 0
    ERR_VALUE = 1        # expecting a value
    ERR_STRING = 2       # unterminated string
    ERR_CONTROL = 3      # control character in string
    ERR_ESCAPE = 4       # bad escape
    ERR_DELIM = 5        # expecting , or closing bracket
    ERR_KEY = 6          # expecting property name
    ERR_COLON = 7        # expecting :
    ERR_EXTRA = 8        # extra data after the value
    ERR_CONSTANT = 9     # NaN / Infinity
    ERR_DEPTH = 10       # nested too deep
    ERR_BIGINT = 11      # integer with too many digits

#: Nesting limit of arrays and objects; equal to ``factstream._json.MAX_DEPTH``
#: (each cimporting module checks that at import).
cdef enum:
    JSON_MAX_DEPTH = 512


cdef extern from *:
    """
    static const char* const fs_json_errors[12] = {
        "ok", "expecting value", "unterminated string", "invalid control character in string",
        "invalid escape", "expecting ',' or closing bracket",
        "expecting property name enclosed in double quotes", "expecting ':' delimiter", "extra data",
        "NaN and Infinity are not valid JSON", "nested too deep", "integer has too many digits",
    };
    """
    const char* const* _ERROR_TEXTS "fs_json_errors"


cdef inline const char* _error_text(int err) noexcept nogil:
    """The message of an ``ERR_*`` code (as CPython's decoder words it)."""
    return _ERROR_TEXTS[err] if 0 <= err <= ERR_BIGINT else _ERROR_TEXTS[0]

cdef struct Scan:
    const unsigned char* start
    const unsigned char* end
    int err
    Py_ssize_t err_at
    bint canonical
    Py_ssize_t int_limit


cdef inline bint _is_ws(unsigned char c) noexcept nogil:
    return c == C_SPACE or c == C_TAB or c == C_LF or c == C_CR


cdef inline int _hexval(unsigned char c) noexcept nogil:
    if C_0 <= c <= C_9:
        return c - 48
    if C_LOWER_A <= c <= C_LOWER_F:
        return c - 87
    if C_UPPER_A <= c <= C_UPPER_F:
        return c - 55
    return -1


cdef inline const unsigned char* _fail(Scan* s, const unsigned char* p, int err) noexcept nogil:
    s.err = err
    s.err_at = p - s.start
    return NULL


cdef inline const unsigned char* _skip_ws(Scan* s, const unsigned char* p) noexcept nogil:
    cdef const unsigned char* q = p
    if q < s.end and q[0] > C_SPACE:  # the compact form: nothing to skip (all four are <= ' ')
        return q
    while q < s.end and _is_ws(q[0]):
        q += 1
    if q != p:
        s.canonical = False
    return q


# Eight bytes at a time (SWAR): the classic "has a zero byte" test,
# (x - 0x01..01) & ~x & 0x80..80, is nonzero exactly when some byte of x is
# zero (borrows only spill upwards from a byte that already matched).
cdef extern from *:
    """
    #define FS_SWAR_ONES 0x0101010101010101ULL
    #define FS_SWAR_HIGH 0x8080808080808080ULL
    /* Index of the first flagged byte of a nonzero mask, for bytes loaded
       little-endian; elsewhere 0 (the caller then steps one byte at a time). */
    static inline int fs_first_flagged(uint64_t mask) {
    #if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        return __builtin_ctzll(mask) >> 3;
    #else
        (void)mask;
        return 0;
    #endif
    }
    """
    const uint64_t _SWAR_ONES "FS_SWAR_ONES"
    const uint64_t _SWAR_HIGH "FS_SWAR_HIGH"
    int _first_flagged "fs_first_flagged"(uint64_t mask) noexcept nogil


# Sixteen bytes at a time where SSE2 is there (every x86-64): one compare per
# byte class and a movemask, where the SWAR test above takes a dozen
# operations per eight bytes. Strings are most of a row's bytes.
cdef extern from *:
    """
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
    #include <emmintrin.h>
    #define FS_HAVE_SSE2 1
    /* Bit i set when byte i is '"', '\\', a control (< 0x20), DEL or
       non-ASCII (a signed compare: bytes from 0x80 are negative). */
    static inline unsigned int fs_string_special16(const unsigned char *p) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i m = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x22)), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x5C))),
            _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7F))));
        return (unsigned int)_mm_movemask_epi8(m);
    }
    static inline int fs_first_flagged16(unsigned int mask) { return __builtin_ctz(mask); }
    #else
    #define FS_HAVE_SSE2 0
    static inline unsigned int fs_string_special16(const unsigned char *p) { (void)p; return 0; }
    static inline int fs_first_flagged16(unsigned int mask) { (void)mask; return 0; }
    #endif
    """
    const bint _HAVE_SSE2 "FS_HAVE_SSE2"
    unsigned int _string_special16 "fs_string_special16"(const unsigned char* p) noexcept nogil
    int _first_flagged16 "fs_first_flagged16"(unsigned int mask) noexcept nogil


cdef inline uint64_t _load8(const unsigned char* p) noexcept nogil:
    cdef uint64_t w
    memcpy(&w, p, 8)
    return w


cdef inline uint64_t _zero_byte(uint64_t x) noexcept nogil:
    return (x - _SWAR_ONES) & ~x & _SWAR_HIGH


cdef inline uint64_t _quote_or_backslash8(uint64_t w) noexcept nogil:
    return _zero_byte(w ^ (_SWAR_ONES * 0x22)) | _zero_byte(w ^ (_SWAR_ONES * 0x5C))


cdef inline uint64_t _string_special8(uint64_t w) noexcept nogil:
    # Nonzero if a byte is '"', '\\', a control (< 0x20), DEL or non-ASCII:
    # everything the byte loop of _scan_string must look at.
    return (_quote_or_backslash8(w) | _zero_byte(w ^ (_SWAR_ONES * 0x7F))
            | ((w - _SWAR_ONES * 0x20) & ~w & _SWAR_HIGH) | (w & _SWAR_HIGH))


cdef inline const unsigned char* _skip_plain8(const unsigned char* p, const unsigned char* end) noexcept nogil:
    # Past the printable ASCII bytes other than '"' and '\\', eight at a time
    # (stops at most seven bytes short of ``end``: the byte loop finishes).
    cdef uint64_t mask
    while p + 8 <= end:
        mask = _string_special8(_load8(p))
        if mask:
            return p + _first_flagged(mask)
        p += 8
    return p


cdef inline const unsigned char* _scan_string(Scan* s, const unsigned char* p) noexcept nogil:
    # p points just after the opening quote; returns the pointer after the closing quote.
    cdef const unsigned char* end = s.end
    cdef unsigned char c
    cdef int i, h
    cdef unsigned int cp
    cdef unsigned int mask16
    while p < end:
        # Skip plain printable ASCII (nothing to check, canonical as it is)
        # sixteen or eight bytes at a time, then straight to the first byte
        # that needs a look.
        if _HAVE_SSE2:
            while p + 16 <= end:
                mask16 = _string_special16(p)
                if mask16:
                    p += _first_flagged16(mask16)
                    break
                p += 16
            else:
                p = _skip_plain8(p, end)
        else:
            p = _skip_plain8(p, end)
        if p >= end:
            break
        c = p[0]
        if c == C_QUOTE:  # "
            return p + 1
        if c == C_BACKSLASH:  # backslash
            if p + 1 >= end:
                return _fail(s, p, ERR_STRING)
            c = p[1]
            if c == C_LOWER_U:  # u
                if p + 6 > end:
                    return _fail(s, p, ERR_ESCAPE)
                cp = 0
                for i in range(2, 6):
                    h = _hexval(p[i])
                    if h < 0:
                        return _fail(s, p, ERR_ESCAPE)
                    if p[i] >= C_UPPER_A and p[i] <= C_UPPER_F:
                        s.canonical = False  # the encoder writes lowercase hex
                    cp = (cp << 4) | h
                # The encoder escapes exactly: controls without a short form and
                # everything from DEL up (surrogates included).
                if cp < 0x20:
                    if cp == C_BS or cp == C_TAB or cp == C_LF or cp == C_FF or cp == C_CR:
                        s.canonical = False
                elif cp < 0x7f:
                    s.canonical = False
                p += 6
            elif c == C_QUOTE or c == C_BACKSLASH or c == C_LOWER_B or c == C_LOWER_F or c == C_LOWER_N or c == C_LOWER_R or c == C_LOWER_T:
                p += 2
            elif c == C_SLASH:  # \/ decodes to '/', which the encoder writes bare
                s.canonical = False
                p += 2
            else:
                return _fail(s, p, ERR_ESCAPE)
        elif c < 0x20:
            return _fail(s, p, ERR_CONTROL)
        else:
            if c >= 0x7f:  # raw DEL or UTF-8: the encoder would write \\u escapes
                s.canonical = False
            p += 1
    return _fail(s, p, ERR_STRING)


cdef inline const unsigned char* _number_tail(const unsigned char* p, const unsigned char* end,
                                             bint* is_float) noexcept nogil:
    # p is just past the integer part's digits: an optional fraction and an
    # optional exponent follow (an exponent without digits is not part of the
    # number, as in CPython's scanner). Returns the end of the number.
    cdef const unsigned char* e_start
    if p + 1 < end and p[0] == C_DOT and C_0 <= p[1] <= C_9:  # fraction
        is_float[0] = True
        p += 2
        while p < end and C_0 <= p[0] <= C_9:
            p += 1
    if p < end and (p[0] == C_LOWER_E or p[0] == C_UPPER_E):  # exponent, backtracked if empty
        e_start = p
        p += 1
        if p < end and (p[0] == C_PLUS or p[0] == C_MINUS):
            p += 1
        if p < end and C_0 <= p[0] <= C_9:
            is_float[0] = True
            while p < end and C_0 <= p[0] <= C_9:
                p += 1
        else:
            p = e_start
    return p


cdef inline const unsigned char* _scan_number(Scan* s, const unsigned char* p) noexcept nogil:
    cdef const unsigned char* end = s.end
    cdef const unsigned char* digits
    cdef bint is_float = False
    if p[0] == C_MINUS:  # -
        p += 1
        if p < end and p[0] == C_UPPER_I:  # -Infinity
            return _fail(s, p, ERR_CONSTANT)
    if p >= end or not (C_0 <= p[0] <= C_9):
        return _fail(s, p, ERR_VALUE)
    digits = p
    if p[0] == C_0:
        p += 1
    else:
        while p < end and C_0 <= p[0] <= C_9:
            p += 1
    p = _number_tail(p, end, &is_float)
    if is_float:
        s.canonical = False  # decided by float repr; re-encode to be safe
    else:
        if p - digits > s.int_limit:
            return _fail(s, digits, ERR_BIGINT)
        if digits != s.start and (digits - 1)[0] == C_MINUS and p - digits == 1 and digits[0] == C_0:
            s.canonical = False  # -0 re-encodes as 0
    return p


cdef inline const unsigned char* _scan_value(Scan* s, const unsigned char* p, int depth) noexcept nogil:
    cdef const unsigned char* end = s.end
    cdef unsigned char c
    cdef const unsigned char* keys[16]
    cdef Py_ssize_t key_lens[16]
    cdef int nkeys, k
    cdef const unsigned char* key_start
    if p >= end:
        return _fail(s, p, ERR_VALUE)
    c = p[0]
    if c == C_QUOTE:
        return _scan_string(s, p + 1)
    if c == C_LBRACE:  # {
        if depth >= JSON_MAX_DEPTH:
            return _fail(s, p, ERR_DEPTH)
        p = _skip_ws(s, p + 1)
        if p < end and p[0] == C_RBRACE:
            return p + 1
        nkeys = 0
        while True:
            if p >= end or p[0] != C_QUOTE:
                return _fail(s, p, ERR_KEY)
            key_start = p
            p = _scan_string(s, p + 1)
            if p == NULL:
                return NULL
            if s.canonical:
                # A repeated key collapses when decoded; in canonical text equal
                # keys are equal bytes, so comparing bytes is enough.
                if nkeys == 16:
                    s.canonical = False
                else:
                    for k in range(nkeys):
                        if key_lens[k] == p - key_start and memcmp(keys[k], key_start, p - key_start) == 0:
                            s.canonical = False
                            break
                    keys[nkeys] = key_start
                    key_lens[nkeys] = p - key_start
                    nkeys += 1
            p = _skip_ws(s, p)
            if p >= end or p[0] != C_COLON:
                return _fail(s, p, ERR_COLON)
            p = _skip_ws(s, p + 1)
            if p < end and p[0] == C_QUOTE:
                p = _scan_string(s, p + 1)
            else:
                p = _scan_value(s, p, depth + 1)
            if p == NULL:
                return NULL
            p = _skip_ws(s, p)
            if p < end and p[0] == C_COMMA:
                p = _skip_ws(s, p + 1)
                continue
            if p < end and p[0] == C_RBRACE:
                return p + 1
            return _fail(s, p, ERR_DELIM)
    if c == C_LBRACKET:  # [
        if depth >= JSON_MAX_DEPTH:
            return _fail(s, p, ERR_DEPTH)
        p = _skip_ws(s, p + 1)
        if p < end and p[0] == C_RBRACKET:
            return p + 1
        while True:
            # Strings and constants, most of a row's items, without a call of their own.
            if p < end and p[0] == C_QUOTE:
                p = _scan_string(s, p + 1)
            elif end - p >= 4 and memcmp(p, b"null", 4) == 0:
                p += 4
            elif end - p >= 5 and memcmp(p, b"false", 5) == 0:
                p += 5
            elif end - p >= 4 and memcmp(p, b"true", 4) == 0:
                p += 4
            else:
                p = _scan_value(s, p, depth + 1)
            if p == NULL:
                return NULL
            p = _skip_ws(s, p)
            if p < end and p[0] == C_COMMA:
                p = _skip_ws(s, p + 1)
                continue
            if p < end and p[0] == C_RBRACKET:
                return p + 1
            return _fail(s, p, ERR_DELIM)
    if c == C_LOWER_N:  # null
        if end - p >= 4 and memcmp(p, b"null", 4) == 0:
            return p + 4
        return _fail(s, p, ERR_VALUE)
    if c == C_LOWER_T:  # true
        if end - p >= 4 and memcmp(p, b"true", 4) == 0:
            return p + 4
        return _fail(s, p, ERR_VALUE)
    if c == C_LOWER_F:  # false
        if end - p >= 5 and memcmp(p, b"false", 5) == 0:
            return p + 5
        return _fail(s, p, ERR_VALUE)
    if c == C_UPPER_N:  # NaN
        if end - p >= 3 and memcmp(p, b"NaN", 3) == 0:
            return _fail(s, p, ERR_CONSTANT)
        return _fail(s, p, ERR_VALUE)
    if c == C_UPPER_I:  # Infinity
        if end - p >= 8 and memcmp(p, b"Infinity", 8) == 0:
            return _fail(s, p, ERR_CONSTANT)
        return _fail(s, p, ERR_VALUE)
    if c == C_MINUS or C_0 <= c <= C_9:
        return _scan_number(s, p)
    return _fail(s, p, ERR_VALUE)


cdef inline Py_ssize_t _int_limit():
    # The interpreter's int(str) digit limit (CPython's decoder obeys it too).
    import sys
    try:
        limit = sys.get_int_max_str_digits()
    except AttributeError:
        return <Py_ssize_t>1 << 60
    return limit if limit > 0 else (<Py_ssize_t>1 << 60)

cdef enum:
    INT_OK = 0
    INT_NOT_INTEGER = 1
    INT_OVERFLOW = 2


cdef inline int _parse_i64(const unsigned char* p, Py_ssize_t n, long long* out) noexcept nogil:
    """The protocol's integer grammar: ASCII digits with an optional leading '-', fitting 64 bits.

    Returns INT_OK, INT_NOT_INTEGER (a non-digit anywhere wins over
    overflow, so the error names the real problem) or INT_OVERFLOW.
    """
    cdef const unsigned char* q = p
    cdef const unsigned char* end = p + n
    cdef bint neg = False
    cdef bint over = False
    cdef uint64_t v = 0
    cdef uint64_t limit
    cdef unsigned int d
    if q < end and q[0] == C_MINUS:
        neg = True
        q += 1
    if q == end:
        return INT_NOT_INTEGER
    limit = (<uint64_t>1 << 63) if neg else ((<uint64_t>1 << 63) - 1)
    while q < end:
        d = q[0] - 48
        if d > 9:
            return INT_NOT_INTEGER
        if not over:
            if v > (limit - d) // 10:
                over = True
            else:
                v = v * 10 + d
        q += 1
    if over:
        return INT_OVERFLOW
    out[0] = <long long>(0 - v) if neg else <long long>v
    return INT_OK


cdef inline bint _all_ascii(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0
    cdef uint64_t acc = 0
    cdef uint64_t w
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        acc |= w
        i += 8
    while i < n:
        acc |= p[i]
        i += 1
    return (acc & <uint64_t>0x8080808080808080ULL) == 0


cdef inline const unsigned char* _scan_document(Scan* s, const unsigned char* p, Py_ssize_t n,
                                               Py_ssize_t int_limit) noexcept nogil:
    """Scan ``p[:n]`` as one JSON document (whitespace around it allowed): the end, or NULL with ``s.err`` set."""
    cdef const unsigned char* q
    s.start = p
    s.end = p + n
    s.err = ERR_NONE
    s.err_at = 0
    s.canonical = True
    s.int_limit = int_limit
    q = _scan_value(s, _skip_ws(s, p), 0)
    if q == NULL:
        return NULL
    q = _skip_ws(s, q)
    if q != s.end:
        return _fail(s, q, ERR_EXTRA)
    return q


cdef inline bint _json_valid(const unsigned char* p, Py_ssize_t n, Py_ssize_t int_limit) noexcept nogil:
    """Whether ``p[:n]`` is one JSON document the codec accepts (no message: callers that need one re-parse)."""
    cdef Scan s
    return _scan_document(&s, p, n, int_limit) != NULL
