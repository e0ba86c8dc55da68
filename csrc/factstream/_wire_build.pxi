# The codec's JSON builder (``include``d by _wire_c.pyx, where it was written
# inline until the module grew past 1,000 lines): turns a row's validated JSON
# bytes into Python objects in one pass, and ``loads_row`` for callers outside.
# It uses the scanner of _json_scan.pxd and the names _wire_c.pyx cimports.

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
