# The codec's JSON builder (``include``d by _wire_c.pyx, where it was written
# inline until the module grew past 1,000 lines): turns a row's validated JSON
# bytes into Python objects in one pass, and ``loads_row`` for callers outside.
# It uses the scanner of _json_scan.pxd and the names _wire_c.pyx cimports.

# ----------------------------------------------------------------- JSON build
#
# Written in C (below) rather than as Cython methods: the builder is mostly
# object allocation, and hand-placed reference counting lets a list collect
# its items on the stack and take them at its exact size, and a string
# come from the short-string cache, without the bookkeeping Cython adds
# around every object-valued call and try block.

cdef extern from *:
    r"""
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
    #include <emmintrin.h>
    #endif
    typedef struct {
        const unsigned char *end;
        Py_UCS4 *buf;      /* scratch for strings with escapes */
        Py_ssize_t cap;
        int defer;         /* > 0: containers built are held untracked (see fs_hold) */
        PyObject **held;   /* each with a reference of its own */
        Py_ssize_t nheld, capheld;
    } fs_builder;

    /* A LineDecoder feed keeps every command and row it builds alive in the
       list it returns, so each young collection the allocations trigger
       during the feed walked (and promoted) all of them built so far: a
       whole-buffer feed paid dozens of collections over its own output.
       While b->defer is set, a finished container (or a tracked command,
       held by the decoder) leaves the collector's lists and is held here (with a reference, so it can never be freed
       while untracked); fs_release tracks them all again before the feed
       returns or raises. In between only C code touches them (the builder
       calls no Python code: keys are exact str, values builtin types), so
       nothing can build a cycle through them that the collector misses. */
    /* Room for one more held object: 0 when there is no memory for it. */
    static inline int fs_held_room(fs_builder *b) {
        if (b->nheld == b->capheld) {
            Py_ssize_t cap = b->capheld ? b->capheld * 2 : 1024;
            PyObject **nh = (PyObject **)PyMem_Realloc(b->held, (size_t)cap * sizeof(PyObject *));
            if (nh == NULL)
                return 0;
            b->held = nh;
            b->capheld = cap;
        }
        return 1;
    }

    static inline void fs_hold(fs_builder *b, PyObject *o) {
        if (!b->defer || !PyObject_GC_IsTracked(o))
            return;  /* a dict of atomic values: CPython keeps it untracked itself */
        if (!fs_held_room(b))
            return;  /* no memory to hold it: it stays tracked (only slower) */
        PyObject_GC_UnTrack(o);
        Py_INCREF(o);
        b->held[b->nheld++] = o;
    }

    /* fs_hold for a container just allocated (PyList_New, a command's
       allocation): tracked, so no need to ask the collector. */
    static inline void fs_hold_new(fs_builder *b, PyObject *o) {
        if (!b->defer)
            return;
        if (b->nheld == b->capheld) {
            fs_hold(b, o);  /* grows the array (or leaves o tracked) */
            return;
        }
        PyObject_GC_UnTrack(o);
        Py_INCREF(o);
        b->held[b->nheld++] = o;
    }

    /* fs_hold for a container born untracked (fs_alloc_untracked): held as it is, 1; 0 when not holding
       (or no memory to hold it): the caller tracks it. */
    static inline int fs_hold_born(fs_builder *b, PyObject *o) {
        if (!b->defer || !fs_held_room(b))
            return 0;
        Py_INCREF(o);
        b->held[b->nheld++] = o;
        return 1;
    }

    /* A list of items[:k], taking their references: PyList_New(k) would
       zero its item array (calloc) only for the items to be copied over it.
       While b->defer is set the list is born untracked and held at once
       (not tracked by PyList_New, untracked and then held); without memory
       to hold it, it is tracked as any list. */
    static inline PyObject *fs_b_list_of(fs_builder *b, PyObject **items, Py_ssize_t k) {
        PyObject *out, **a = NULL;
        if (k) {
            a = (PyObject **)PyMem_Malloc((size_t)k * sizeof(PyObject *));
            if (a == NULL)
                return PyErr_NoMemory();  /* the items are still the caller's */
        }
        out = b->defer ? (PyObject *)PyObject_GC_New(PyListObject, &PyList_Type) : PyList_New(0);
        if (out == NULL) {
            PyMem_Free(a);
            return NULL;
        }
        if (k)
            memcpy(a, items, (size_t)k * sizeof(PyObject *));
        ((PyListObject *)out)->ob_item = a;
        ((PyListObject *)out)->allocated = k;
        Py_SET_SIZE(out, k);
        if (b->defer && !fs_hold_born(b, out))
            PyObject_GC_Track(out);  /* no memory to hold it: tracked as any list */
        return out;
    }

    /* Track every held object again (those already tracked are left) and
       drop the reference held, in one pass: each object is touched once (a
       big piece's objects no longer fit in the cache, and a second pass over
       them missed it again). Garbage of a failed build is freed here; no
       object is freed before its own turn, its held reference keeps it. */
    #define FS_RELEASE_AHEAD 8
    static void fs_release(fs_builder *b) {
        PyObject **h = b->held;
        Py_ssize_t i, n = b->nheld, cap = b->capheld;
        if (n == 0)
            return;
        b->held = NULL;  /* detached while released: a nested hold gets its own array */
        b->nheld = b->capheld = 0;
        for (i = 0; i < n; i++) {
    #if defined(__GNUC__)
            if (i + FS_RELEASE_AHEAD < n)  /* the collector's header sits just before the object */
                __builtin_prefetch((const char *)h[i + FS_RELEASE_AHEAD] - 16, 1);
    #endif
            if (!PyObject_GC_IsTracked(h[i]))
                PyObject_GC_Track(h[i]);
            Py_DECREF(h[i]);
        }
        if (b->held == NULL) {
            b->held = h;
            b->capheld = cap;
        } else {
            PyMem_Free(h);
        }
    }

    #define FS_B_ONES 0x0101010101010101ULL
    #define FS_B_HIGH 0x8080808080808080ULL
    #define FS_B_LIST_STACK 16   /* items a list holds on the stack before it spills into a growing list */
    #define FS_B_STR_MAX 16      /* bytes: two 64-bit words */
    #define FS_B_STR_BITS 9
    #define FS_B_STR_SLOTS (1 << FS_B_STR_BITS)

    /* Short strings repeat heavily in rows (event types, memberships, cache
       names, receipt types, presence states, dict keys): the last ASCII
       string without escapes seen in its slot, keyed by its bytes, is shared
       instead of allocated again (str is immutable: sharing is invisible but
       to `is`). Longer strings (user, room and event ids) rarely repeat within
       a few hundred rows, so they are not looked up. */
    typedef struct {
        uint64_t w0, w1;
        Py_ssize_t n;
        PyObject *s;
    } fs_strslot;
    static fs_strslot fs_strs[FS_B_STR_SLOTS];

    /* A value's dispatch, inlined where a value is read (a list's item, a dict's value, a row's
       item): strings and constants then cost no call of their own, only containers and numbers do. */
    #if defined(__GNUC__)
    static inline __attribute__((always_inline)) PyObject *fs_b_value(fs_builder *b, const unsigned char **pp);
    #else
    static inline PyObject *fs_b_value(fs_builder *b, const unsigned char **pp);
    #endif

    static inline const unsigned char *fs_b_ws(const fs_builder *b, const unsigned char *p) {
        if (p < b->end && *p > ' ')  /* the compact form: nothing to skip */
            return p;
        while (p < b->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
            p++;
        return p;
    }

    static inline uint64_t fs_b_load8(const unsigned char *p) {
        uint64_t w;
        memcpy(&w, p, 8);
        return w;
    }

    static inline uint64_t fs_b_zero(uint64_t x) { return (x - FS_B_ONES) & ~x & FS_B_HIGH; }

    static inline uint64_t fs_b_quote_or_backslash(uint64_t w) {
        return fs_b_zero(w ^ (FS_B_ONES * 0x22)) | fs_b_zero(w ^ (FS_B_ONES * 0x5C));
    }

    static inline int fs_b_first(uint64_t mask) {
    #if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        return __builtin_ctzll(mask) >> 3;
    #else
        (void)mask;
        return 0;  /* the byte loop steps on from here */
    #endif
    }

    static PyObject *fs_b_short_ascii(const fs_builder *b, const unsigned char *p, Py_ssize_t n) {
        /* 0 < n <= FS_B_STR_MAX, ASCII. */
        uint64_t w0, w1;
        fs_strslot *slot;
        PyObject *text;
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (b->end - p >= 16) {  /* two whole words readable: load and keep the string's bytes */
            w0 = fs_b_load8(p);
            w1 = fs_b_load8(p + 8);
            if (n < 8) {
                w0 &= (((uint64_t)1) << (8 * n)) - 1;
                w1 = 0;
            } else if (n < 16) {
                w1 &= (((uint64_t)1) << (8 * (n - 8))) - 1;
            }
        } else
    #endif
        {
            unsigned char tmp[16] = {0};
            memcpy(tmp, p, (size_t)n);
            memcpy(&w0, tmp, 8);
            memcpy(&w1, tmp + 8, 8);
        }
        slot = &fs_strs[((w0 * 0x9E3779B97F4A7C15ULL) ^ (w1 * 0xC2B2AE3D27D4EB4FULL) ^ (uint64_t)n) >> (64 - FS_B_STR_BITS)];
        if (slot->s != NULL && slot->n == n && slot->w0 == w0 && slot->w1 == w1) {
            Py_INCREF(slot->s);
            return slot->s;
        }
        text = PyUnicode_New(n, 127);
        if (text == NULL)
            return NULL;
        memcpy(PyUnicode_DATA(text), p, (size_t)n);
        Py_INCREF(text);
        Py_XSETREF(slot->s, text);
        slot->w0 = w0;
        slot->w1 = w1;
        slot->n = n;
        return text;
    }

    static inline unsigned int fs_b_hex4(const unsigned char *p) {
        unsigned int cp = 0;
        int i;
        for (i = 0; i < 4; i++) {
            unsigned char c = p[i];
            cp = (cp << 4) | (unsigned int)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        return cp;
    }

    /* One escape at p (p[0] is the backslash, the escape is complete and
       well formed): its code point, and p moved past it. A \u high
       surrogate followed by a \u low one is one code point (as fs_b_string). */
    static inline Py_UCS4 fs_b_escape(const unsigned char **pp, const unsigned char *end) {
        const unsigned char *p = *pp;
        unsigned int cp, cp2;
        switch (p[1]) {
        case 'u':
            cp = fs_b_hex4(p + 2);
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                cp2 = fs_b_hex4(p + 2);
                if (cp2 >= 0xDC00 && cp2 <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (cp2 - 0xDC00);
                    p += 6;
                }
            }
            *pp = p;
            return cp;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        default: cp = p[1];  /* " \ / */
        }
        *pp = p + 2;
        return cp;
    }

    /* The text of start[:end] (a string's contents, without its quotes) that
       has escapes but no byte past ASCII, which is how canonical JSON writes
       any text: the same str fs_b_string builds, in two short passes (the
       length and widest character, then the characters written at the
       str's own width: runs between escapes copied whole). */
    static PyObject *fs_b_escaped_ascii(const unsigned char *start, const unsigned char *end) {
        const unsigned char *p = start, *q;
        Py_ssize_t n = 0;
        Py_UCS4 maxchar = 127, cp;
        PyObject *text;
        int kind;
        void *data;
        while ((q = (const unsigned char *)memchr(p, '\\', (size_t)(end - p))) != NULL) {
            n += q - p;
            cp = fs_b_escape(&q, end);
            if (cp > maxchar)
                maxchar = cp;
            n++;
            p = q;
        }
        n += end - p;
        text = PyUnicode_New(n, maxchar);
        if (text == NULL)
            return NULL;
        kind = PyUnicode_KIND(text);
        data = PyUnicode_DATA(text);
        p = start;
        n = 0;
        if (kind == PyUnicode_1BYTE_KIND) {
            Py_UCS1 *out = (Py_UCS1 *)data;
            while ((q = (const unsigned char *)memchr(p, '\\', (size_t)(end - p))) != NULL) {
                memcpy(out + n, p, (size_t)(q - p));
                n += q - p;
                out[n++] = (Py_UCS1)fs_b_escape(&q, end);
                p = q;
            }
            memcpy(out + n, p, (size_t)(end - p));
        } else if (kind == PyUnicode_2BYTE_KIND) {
            Py_UCS2 *out = (Py_UCS2 *)data;
            while (p < end) {
                if (*p == '\\')
                    out[n++] = (Py_UCS2)fs_b_escape(&p, end);
                else
                    out[n++] = *p++;
            }
        } else {
            Py_UCS4 *out = (Py_UCS4 *)data;
            while (p < end) {
                if (*p == '\\')
                    out[n++] = fs_b_escape(&p, end);
                else
                    out[n++] = *p++;
            }
        }
        return text;
    }

    static PyObject *fs_b_string(fs_builder *b, const unsigned char **pp) {
        /* *pp is at the opening quote; the scanner accepted the string, so
           its closing quote is before end and every escape is complete. */
        const unsigned char *p = *pp + 1;
        const unsigned char *start = p;
        const unsigned char *end = b->end;
        int simple = 1;
        uint64_t high = 0, w, mask;
        Py_UCS4 *out;
        Py_ssize_t n = 0;
        int i;
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
        unsigned int highbits = 0;  /* movemask of the blocks skipped: their bytes' top bits */
    #endif
        for (;;) {
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
            while (p + 16 <= end) {
                __m128i v = _mm_loadu_si128((const __m128i *)p);
                unsigned int m = (unsigned int)_mm_movemask_epi8(
                    _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x22)), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x5C))));
                if (m) {
                    i = __builtin_ctz(m);
                    highbits |= (unsigned int)_mm_movemask_epi8(v) & ((1u << i) - 1);
                    p += i;
                    goto found;
                }
                highbits |= (unsigned int)_mm_movemask_epi8(v);
                p += 16;
            }
    #endif
            while (p + 8 <= end) {
                w = fs_b_load8(p);
                mask = fs_b_quote_or_backslash(w);
                if (mask) {
                    i = fs_b_first(mask);
                    if (i)
                        high |= w & ((((uint64_t)1) << (8 * i)) - 1);  /* the bytes before it */
                    p += i;
                    break;
                }
                high |= w;
                p += 8;
            }
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
        found:
    #endif
            if (*p == '"')
                break;
            if (*p == '\\') {
                simple = 0;
                p += 2;
            } else {
                high |= *p;
                p++;
            }
        }
        *pp = p + 1;
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
        if (highbits)
            high |= FS_B_HIGH;
    #endif
        if (simple) {
            if (high & FS_B_HIGH)
                return PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
            if (p - start > 0 && p - start <= FS_B_STR_MAX)
                return fs_b_short_ascii(b, start, p - start);
            {
                PyObject *text = PyUnicode_New(p - start, 127);  /* ASCII: a copy, no decoding */
                if (text != NULL)
                    memcpy(PyUnicode_DATA(text), start, (size_t)(p - start));
                return text;
            }
        }
        if (!(high & FS_B_HIGH))
            return fs_b_escaped_ascii(start, p);  /* escapes in ASCII text: canonical JSON's only kind */
        /* Escapes and UTF-8: decode into code points (at most one per input byte). */
        end = p;
        if (end - start + 1 > b->cap) {
            Py_UCS4 *nb = (Py_UCS4 *)PyMem_Realloc(b->buf, (size_t)(end - start + 1) * sizeof(Py_UCS4));
            if (nb == NULL)
                return PyErr_NoMemory();
            b->buf = nb;
            b->cap = end - start + 1;
        }
        out = b->buf;
        p = start;
        while (p < end) {
            unsigned char c = *p;
            if (c == '\\') {
                c = p[1];
                if (c == 'u') {
                    unsigned int cp = fs_b_hex4(p + 2), cp2;
                    p += 6;
                    if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                        cp2 = fs_b_hex4(p + 2);
                        if (cp2 >= 0xDC00 && cp2 <= 0xDFFF) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (cp2 - 0xDC00);
                            p += 6;
                        }
                    }
                    out[n] = cp;
                } else {
                    switch (c) {
                    case 'b': out[n] = 8; break;
                    case 'f': out[n] = 12; break;
                    case 'n': out[n] = 10; break;
                    case 'r': out[n] = 13; break;
                    case 't': out[n] = 9; break;
                    default: out[n] = c;  /* " \ / */
                    }
                    p += 2;
                }
            } else if (c < 0x80) {
                out[n] = c;
                p += 1;
            } else if (c < 0xE0) {
                out[n] = ((Py_UCS4)(c & 0x1F) << 6) | (p[1] & 0x3F);
                p += 2;
            } else if (c < 0xF0) {
                out[n] = ((Py_UCS4)(c & 0x0F) << 12) | ((Py_UCS4)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
                p += 3;
            } else {
                out[n] = ((Py_UCS4)(c & 0x07) << 18) | ((Py_UCS4)(p[1] & 0x3F) << 12)
                         | ((Py_UCS4)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
                p += 4;
            }
            n++;
        }
        return PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, n);
    }

    static PyObject *fs_b_number(fs_builder *b, const unsigned char **pp) {
        const unsigned char *p = *pp;
        const unsigned char *start = p;
        const unsigned char *end = b->end;
        const unsigned char *e_start;
        int is_float = 0, neg = 0;
        long long v = 0;
        Py_ssize_t ndigits;
        PyObject *text, *result;
        if (*p == '-') {
            neg = 1;
            p++;
        }
        if (*p == '0')
            p++;
        else
            while (p < end && *p >= '0' && *p <= '9')
                p++;
        ndigits = p - start - neg;
        /* fraction, then exponent (backtracked when it has no digits), as the scanner */
        if (p + 1 < end && p[0] == '.' && p[1] >= '0' && p[1] <= '9') {
            is_float = 1;
            p += 2;
            while (p < end && *p >= '0' && *p <= '9')
                p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            e_start = p++;
            if (p < end && (*p == '+' || *p == '-'))
                p++;
            if (p < end && *p >= '0' && *p <= '9') {
                is_float = 1;
                while (p < end && *p >= '0' && *p <= '9')
                    p++;
            } else {
                p = e_start;
            }
        }
        *pp = p;
        if (!is_float && ndigits <= 18) {
            const unsigned char *q;
            for (q = start + neg; q < start + neg + ndigits; q++)
                v = v * 10 + (*q - '0');
            return PyLong_FromLongLong(neg ? -v : v);
        }
        text = PyBytes_FromStringAndSize((const char *)start, p - start);  /* NUL-terminated copy */
        if (text == NULL)
            return NULL;
        if (is_float) {
            /* Correctly rounded as float(): past the double range +-inf (as
               Synapse's json module), below it +-0.0. */
            double d = PyOS_string_to_double(PyBytes_AS_STRING(text), NULL, NULL);
            result = (d == -1.0 && PyErr_Occurred()) ? NULL : PyFloat_FromDouble(d);
        } else {
            result = PyLong_FromString(PyBytes_AS_STRING(text), NULL, 10);
        }
        Py_DECREF(text);
        return result;
    }

    static PyObject *fs_b_list(fs_builder *b, const unsigned char **pp) {
        PyObject *items[FS_B_LIST_STACK];
        Py_ssize_t k = 0, i;
        PyObject *out = NULL, *v;
        const unsigned char *p = fs_b_ws(b, *pp + 1);
        if (*p == ']') {
            *pp = p + 1;
            return fs_b_list_of(b, NULL, 0);  /* held when b->defer */
        }
        for (;;) {
            *pp = p;
            v = fs_b_value(b, pp);
            if (v == NULL)
                goto fail;
            if (out != NULL) {
                if (PyList_Append(out, v) < 0) {
                    Py_DECREF(v);
                    goto fail;
                }
                Py_DECREF(v);
            } else if (k == FS_B_LIST_STACK) {  /* spill */
                out = PyList_New(k);
                if (out == NULL) {
                    Py_DECREF(v);
                    goto fail;
                }
                for (i = 0; i < k; i++)
                    PyList_SET_ITEM(out, i, items[i]);
                k = 0;
                if (PyList_Append(out, v) < 0) {
                    Py_DECREF(v);
                    goto fail;
                }
                Py_DECREF(v);
            } else {
                items[k++] = v;
            }
            p = fs_b_ws(b, *pp);
            if (*p == ',') {
                p = fs_b_ws(b, p + 1);
                continue;
            }
            *pp = p + 1;  /* ] */
            break;
        }
        if (out == NULL) {
            out = fs_b_list_of(b, items, k);  /* takes the items; held when b->defer */
            if (out == NULL)
                goto fail;
            return out;
        }
        fs_hold_new(b, out);
        return out;
    fail:
        for (i = 0; i < k; i++)
            Py_DECREF(items[i]);
        Py_XDECREF(out);
        return NULL;
    }

    static PyObject *fs_b_dict(fs_builder *b, const unsigned char **pp) {
        PyObject *out = PyDict_New(), *key, *v;
        const unsigned char *p;
        int rc;
        if (out == NULL)
            return NULL;
        p = fs_b_ws(b, *pp + 1);
        if (*p == '}') {
            *pp = p + 1;
            return out;
        }
        for (;;) {
            *pp = p;
            key = fs_b_string(b, pp);
            if (key == NULL)
                goto fail;
            p = fs_b_ws(b, *pp);
            *pp = fs_b_ws(b, p + 1);  /* past ':' */
            v = fs_b_value(b, pp);
            if (v == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            rc = PyDict_SetItem(out, key, v);
            Py_DECREF(key);
            Py_DECREF(v);
            if (rc < 0)
                goto fail;
            p = fs_b_ws(b, *pp);
            if (*p == ',') {
                p = fs_b_ws(b, p + 1);
                continue;
            }
            *pp = p + 1;  /* } */
            fs_hold(b, out);
            return out;
        }
    fail:
        Py_DECREF(out);
        return NULL;
    }

    static inline PyObject *fs_b_value(fs_builder *b, const unsigned char **pp) {
        const unsigned char *p = *pp;
        switch (*p) {
        case '"': return fs_b_string(b, pp);
        case '[': return fs_b_list(b, pp);
        case '{': return fs_b_dict(b, pp);
        case 'n': *pp = p + 4; Py_RETURN_NONE;
        case 't': *pp = p + 4; Py_RETURN_TRUE;
        case 'f': *pp = p + 5; Py_RETURN_FALSE;
        default: return fs_b_number(b, pp);
        }
    }

    /* One document p[:n] the scanner accepted (whitespace around it allowed). */
    static PyObject *fs_build(fs_builder *b, const unsigned char *p, Py_ssize_t n) {
        b->end = p + n;
        p = fs_b_ws(b, p);
        return fs_b_value(b, &p);
    }

    /* ------------------------------------------------------------------
       The validating builder: one pass that checks and builds, for callers
       that want the row at once (parse_line(..., rows=True)). Every read is
       bounds-checked; it accepts only what the scanner accepts and builds
       what fs_build builds. It never words an error: on anything it does not
       accept (bad grammar, NaN/Infinity, a too-deep nesting, an integer past
       FS_V_INT_DIGITS digits) it returns NULL with no exception set, and the
       caller runs the scanner, which gives today's exact message (or accepts,
       and the trusted builder runs). The bytes must be valid UTF-8 (a parsed
       line is checked for that first). */

    #define FS_V_INT_DIGITS 640  /* longer integers go the scanner's way (it knows the interpreter's limit) */
    #define FS_V_GIVE_UP ((PyObject *)0)
    #define FS_V_MAX_DEPTH 512   /* the scanner's JSON_MAX_DEPTH (checked at import) */

    /* A value is dispatched inline where it is read (a list's item, a dict's
       value); only containers are calls: a row's strings, numbers and nulls
       then cost no call of the container-sized function. */
    #if defined(__GNUC__)
    #define FS_V_INLINE static inline __attribute__((always_inline))
    #define FS_V_NOINLINE static __attribute__((noinline))
    #else
    #define FS_V_INLINE static inline
    #define FS_V_NOINLINE static
    #endif
    FS_V_INLINE PyObject *fs_v_value(fs_builder *b, const unsigned char **pp, int depth);
    FS_V_NOINLINE PyObject *fs_v_list(fs_builder *b, const unsigned char **pp, int depth);
    FS_V_NOINLINE PyObject *fs_v_dict(fs_builder *b, const unsigned char **pp, int depth);

    static inline const unsigned char *fs_v_ws(const fs_builder *b, const unsigned char *p) {
        if (p < b->end && *p > ' ')  /* the compact form: nothing to skip */
            return p;
        while (p < b->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
            p++;
        return p;
    }

    static inline int fs_v_hex(unsigned char c) {
        if (c >= '0' && c <= '9') return c - '0';
        c |= 0x20;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    }

    #define FS_V_ESC 16  /* escapes a string's scan keeps the place and code point of */

    static inline int fs_v_hex4(const unsigned char *p) {
        int a = fs_v_hex(p[0]), b = fs_v_hex(p[1]), c = fs_v_hex(p[2]), d = fs_v_hex(p[3]);
        if ((a | b | c | d) < 0)
            return -1;
        return (a << 12) | (b << 8) | (c << 4) | d;
    }

    /* The str of start[:end] (ASCII, escapes at esc_at[:nesc], ending at
       esc_end, with code points esc_cp): n characters, the widest maxchar. */
    static PyObject *fs_b_with_escapes(const unsigned char *start, const unsigned char *end, Py_ssize_t n,
                                       Py_UCS4 maxchar, const unsigned char *const *esc_at,
                                       const unsigned char *const *esc_end, const Py_UCS4 *esc_cp, Py_ssize_t nesc) {
        PyObject *text = PyUnicode_New(n, maxchar);
        const unsigned char *src = start, *stop;
        Py_ssize_t e, o = 0, run, i;
        int kind;
        void *data;
        if (text == NULL)
            return NULL;
        kind = PyUnicode_KIND(text);
        data = PyUnicode_DATA(text);
        for (e = 0; e <= nesc; e++) {
            stop = e < nesc ? esc_at[e] : end;
            run = stop - src;
            if (kind == PyUnicode_1BYTE_KIND) {
                memcpy((Py_UCS1 *)data + o, src, (size_t)run);
                if (e < nesc)
                    ((Py_UCS1 *)data)[o + run] = (Py_UCS1)esc_cp[e];
            } else if (kind == PyUnicode_2BYTE_KIND) {
                for (i = 0; i < run; i++)
                    ((Py_UCS2 *)data)[o + i] = src[i];
                if (e < nesc)
                    ((Py_UCS2 *)data)[o + run] = (Py_UCS2)esc_cp[e];
            } else {
                for (i = 0; i < run; i++)
                    ((Py_UCS4 *)data)[o + i] = src[i];
                if (e < nesc)
                    ((Py_UCS4 *)data)[o + run] = esc_cp[e];
            }
            o += run + 1;
            if (e < nesc)
                src = esc_end[e];
        }
        return text;
    }

    static PyObject *fs_v_string(fs_builder *b, const unsigned char **pp) {
        /* *pp is at the opening quote. First find the closing quote, checking
           every byte the scanner checks; then build as fs_b_string does. */
        const unsigned char *p = *pp + 1;
        const unsigned char *start = p;
        const unsigned char *end = b->end;
        int simple = 1;
        uint64_t high = 0;
        /* The escapes met (the first FS_V_ESC): where each starts and ends and
           its code point, so that the str is written without reading them again. */
        const unsigned char *esc_at[FS_V_ESC], *esc_end[FS_V_ESC];
        Py_UCS4 esc_cp[FS_V_ESC], maxchar = 127;
        Py_ssize_t nesc = 0, removed = 0;
        for (;;) {
    #if defined(__SSE2__) && defined(__GNUC__) && !defined(FACTSTREAM_NO_SIMD)
            while (end - p >= 16) {
                __m128i v = _mm_loadu_si128((const __m128i *)p);
                __m128i ctl = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1F)), v);  /* v <= 0x1F, unsigned */
                unsigned int m = (unsigned int)_mm_movemask_epi8(_mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x22)), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x5C))), ctl));
                if (m) {
                    int i = __builtin_ctz(m);
                    if ((unsigned int)_mm_movemask_epi8(v) & ((1u << i) - 1))
                        high = FS_B_HIGH;
                    p += i;
                    break;
                }
                if (_mm_movemask_epi8(v))
                    high = FS_B_HIGH;
                p += 16;
            }
    #endif
            while (end - p >= 8) {
                uint64_t w = fs_b_load8(p);
                uint64_t mask = fs_b_quote_or_backslash(w) | ((w - FS_B_ONES * 0x20) & ~w & FS_B_HIGH);
                if (mask) {
                    int i = fs_b_first(mask);
                    if (i)
                        high |= w & ((((uint64_t)1) << (8 * i)) - 1);
                    p += i;
                    break;
                }
                high |= w;
                p += 8;
            }
            if (p >= end)
                return FS_V_GIVE_UP;  /* unterminated */
            if (*p == '"')
                break;
            if (*p == '\\') {
                const unsigned char *q = p;
                unsigned char c;
                Py_UCS4 cp;
                if (end - p < 2)
                    return FS_V_GIVE_UP;
                c = p[1];
                if (c == 'u') {
                    int h;
                    if (end - p < 6 || (h = fs_v_hex4(p + 2)) < 0)
                        return FS_V_GIVE_UP;
                    cp = (Py_UCS4)h;
                    p += 6;
                    /* a high surrogate and a low one make one code point (as fs_b_escape) */
                    if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u'
                        && (h = fs_v_hex4(p + 2)) >= 0xDC00 && h <= 0xDFFF) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + ((Py_UCS4)h - 0xDC00);
                        p += 6;
                    }
                } else {
                    switch (c) {
                    case '"': case '\\': case '/': cp = c; break;
                    case 'b': cp = 8; break;
                    case 'f': cp = 12; break;
                    case 'n': cp = 10; break;
                    case 'r': cp = 13; break;
                    case 't': cp = 9; break;
                    default: return FS_V_GIVE_UP;
                    }
                    p += 2;
                }
                if (nesc < FS_V_ESC) {
                    esc_at[nesc] = q;
                    esc_end[nesc] = p;
                    esc_cp[nesc] = cp;
                }
                nesc++;
                if (cp > maxchar)
                    maxchar = cp;
                removed += (p - q) - 1;
                simple = 0;
            } else if (*p < 0x20) {
                return FS_V_GIVE_UP;  /* control character */
            } else {
                high |= *p;
                p++;
            }
        }
        if (simple) {
            *pp = p + 1;
            if (high & FS_B_HIGH)
                return PyUnicode_DecodeUTF8((const char *)start, p - start, NULL);
            if (p - start > 0 && p - start <= FS_B_STR_MAX)
                return fs_b_short_ascii(b, start, p - start);
            {
                PyObject *text = PyUnicode_New(p - start, 127);
                if (text != NULL)
                    memcpy(PyUnicode_DATA(text), start, (size_t)(p - start));
                return text;
            }
        }
        /* Escapes, all checked complete and well-formed. */
        if (!(high & FS_B_HIGH)) {
            *pp = p + 1;
            if (nesc <= FS_V_ESC)
                return fs_b_with_escapes(start, p, p - start - removed, maxchar, esc_at, esc_end, esc_cp, nesc);
            return fs_b_escaped_ascii(start, p);
        }
        /* and bytes past ASCII (not canonical): fs_b_string decodes from the
           opening quote (it reads nothing past the closing one). */
        *pp = start - 1;
        return fs_b_string(b, pp);
    }

    static PyObject *fs_v_number(fs_builder *b, const unsigned char **pp) {
        const unsigned char *p = *pp;
        const unsigned char *end = b->end;
        const unsigned char *digits, *e_start;
        unsigned long long v = 0;
        unsigned int d;
        int is_float = 0, neg = 0;
        if (*p == '-') {
            neg = 1;
            p++;
        }
        if (p >= end || *p < '0' || *p > '9')
            return FS_V_GIVE_UP;  /* expecting value, or -Infinity */
        digits = p;
        /* The usual number, an integer of up to 18 digits, is read and
           valued in this one loop; a fraction, an exponent or a longer
           integer goes the general way below (the same bytes, read again). */
        if (*p == '0')
            p++;
        else
            while (p < end && (d = (unsigned int)(*p - '0')) <= 9) {
                v = v * 10 + d;
                p++;
            }
        if ((p >= end || (*p != '.' && *p != 'e' && *p != 'E')) && p - digits <= 18) {
            *pp = p;
            return PyLong_FromLongLong(neg ? -(long long)v : (long long)v);
        }
        if (end - p >= 2 && p[0] == '.' && p[1] >= '0' && p[1] <= '9') {
            is_float = 1;
            p += 2;
            while (p < end && *p >= '0' && *p <= '9')
                p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            e_start = p++;
            if (p < end && (*p == '+' || *p == '-'))
                p++;
            if (p < end && *p >= '0' && *p <= '9') {
                is_float = 1;
                while (p < end && *p >= '0' && *p <= '9')
                    p++;
            } else {
                p = e_start;
            }
        }
        if (!is_float && p - digits > FS_V_INT_DIGITS)
            return FS_V_GIVE_UP;
        /* The number is p[:] as the scanner delimits it: fs_b_number reads the same bytes, bounded by end. */
        return fs_b_number(b, pp);
    }

    FS_V_NOINLINE PyObject *fs_v_list(fs_builder *b, const unsigned char **pp, int depth) {
        PyObject *items[FS_B_LIST_STACK];
        Py_ssize_t k = 0, i;
        PyObject *out = NULL, *v;
        const unsigned char *p = fs_v_ws(b, *pp + 1);
        if (p < b->end && *p == ']') {
            *pp = p + 1;
            return fs_b_list_of(b, NULL, 0);  /* held when b->defer */
        }
        for (;;) {
            *pp = p;
            v = fs_v_value(b, pp, depth + 1);
            if (v == NULL)
                goto fail;
            if (out != NULL) {
                if (PyList_Append(out, v) < 0) {
                    Py_DECREF(v);
                    goto fail;
                }
                Py_DECREF(v);
            } else if (k == FS_B_LIST_STACK) {
                out = PyList_New(k);
                if (out == NULL) {
                    Py_DECREF(v);
                    goto fail;
                }
                for (i = 0; i < k; i++)
                    PyList_SET_ITEM(out, i, items[i]);
                k = 0;
                if (PyList_Append(out, v) < 0) {
                    Py_DECREF(v);
                    goto fail;
                }
                Py_DECREF(v);
            } else {
                items[k++] = v;
            }
            p = fs_v_ws(b, *pp);
            if (p < b->end && *p == ',') {
                p = fs_v_ws(b, p + 1);
                continue;
            }
            if (p < b->end && *p == ']') {
                *pp = p + 1;
                break;
            }
            goto fail;  /* expecting ',' or ']' */
        }
        if (out == NULL) {
            out = fs_b_list_of(b, items, k);  /* takes the items; held when b->defer */
            if (out == NULL)
                goto fail;
            return out;
        }
        fs_hold_new(b, out);
        return out;
    fail:
        for (i = 0; i < k; i++)
            Py_DECREF(items[i]);
        Py_XDECREF(out);
        return NULL;
    }

    FS_V_NOINLINE PyObject *fs_v_dict(fs_builder *b, const unsigned char **pp, int depth) {
        PyObject *out = PyDict_New(), *key, *v;
        const unsigned char *p;
        int rc;
        if (out == NULL)
            return NULL;
        p = fs_v_ws(b, *pp + 1);
        if (p < b->end && *p == '}') {
            *pp = p + 1;
            return out;
        }
        for (;;) {
            if (p >= b->end || *p != '"')
                goto fail;  /* expecting property name */
            *pp = p;
            key = fs_v_string(b, pp);
            if (key == NULL)
                goto fail;
            p = fs_v_ws(b, *pp);
            if (p >= b->end || *p != ':') {
                Py_DECREF(key);
                goto fail;
            }
            *pp = fs_v_ws(b, p + 1);
            v = fs_v_value(b, pp, depth + 1);
            if (v == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            rc = PyDict_SetItem(out, key, v);
            Py_DECREF(key);
            Py_DECREF(v);
            if (rc < 0)
                goto fail;
            p = fs_v_ws(b, *pp);
            if (p < b->end && *p == ',') {
                p = fs_v_ws(b, p + 1);
                continue;
            }
            if (p < b->end && *p == '}') {
                *pp = p + 1;
                fs_hold(b, out);
                return out;
            }
            goto fail;
        }
    fail:
        Py_DECREF(out);
        return NULL;
    }

    FS_V_INLINE PyObject *fs_v_value(fs_builder *b, const unsigned char **pp, int depth) {
        const unsigned char *p = *pp;
        const unsigned char *end = b->end;
        if (p >= end)
            return FS_V_GIVE_UP;
        switch (*p) {
        case '"': return fs_v_string(b, pp);
        case '[':
            if (depth >= FS_V_MAX_DEPTH)
                return FS_V_GIVE_UP;
            return fs_v_list(b, pp, depth);
        case '{':
            if (depth >= FS_V_MAX_DEPTH)
                return FS_V_GIVE_UP;
            return fs_v_dict(b, pp, depth);
        case 'n':
            if (end - p >= 4 && memcmp(p, "null", 4) == 0) { *pp = p + 4; Py_RETURN_NONE; }
            return FS_V_GIVE_UP;
        case 't':
            if (end - p >= 4 && memcmp(p, "true", 4) == 0) { *pp = p + 4; Py_RETURN_TRUE; }
            return FS_V_GIVE_UP;
        case 'f':
            if (end - p >= 5 && memcmp(p, "false", 5) == 0) { *pp = p + 5; Py_RETURN_FALSE; }
            return FS_V_GIVE_UP;
        default:
            if (*p == '-' || (*p >= '0' && *p <= '9'))
                return fs_v_number(b, pp);
            return FS_V_GIVE_UP;
        }
    }

    /* One document p[:n] (whitespace around it allowed), validated while
       built: the value, or NULL (an exception set only when building itself
       failed, e.g. out of memory; the caller then takes the scanner's way). */
    static PyObject *fs_build_checked(fs_builder *b, const unsigned char *p, Py_ssize_t n) {
        PyObject *v;
        b->end = p + n;
        p = fs_v_ws(b, p);
        v = fs_v_value(b, &p, 0);
        if (v == NULL)
            return NULL;
        if (fs_v_ws(b, p) != b->end) {  /* extra data */
            Py_DECREF(v);
            return NULL;
        }
        return v;
    }
    """
    ctypedef struct fs_builder:
        const unsigned char* end
        Py_UCS4* buf
        Py_ssize_t cap
        int defer
        PyObject** held
        Py_ssize_t nheld
        Py_ssize_t capheld
    void fs_hold(fs_builder* b, PyObject* o)
    void fs_hold_new(fs_builder* b, PyObject* o)
    bint fs_hold_born(fs_builder* b, PyObject* o)
    void fs_release(fs_builder* b)
    object fs_build(fs_builder* b, const unsigned char* p, Py_ssize_t n)
    PyObject* fs_build_checked(fs_builder* b, const unsigned char* p, Py_ssize_t n)
    const int FS_V_MAX_DEPTH


if FS_V_MAX_DEPTH != JSON_MAX_DEPTH:
    raise ImportError(f"the validating builder's depth limit {FS_V_MAX_DEPTH} differs from the scanner's {JSON_MAX_DEPTH}")


cdef class _Builder:
    """Builds Python objects from JSON bytes the scanner accepted (see the C code above)."""

    cdef fs_builder b

    def __cinit__(self):
        self.b.end = NULL
        self.b.buf = NULL
        self.b.cap = 0
        self.b.defer = 0
        self.b.held = NULL
        self.b.nheld = 0
        self.b.capheld = 0

    def __dealloc__(self):
        fs_release(&self.b)
        if self.b.buf != NULL:
            PyMem_Free(self.b.buf)
        if self.b.held != NULL:
            PyMem_Free(self.b.held)

    cdef inline object build(self, const unsigned char* p, Py_ssize_t n):
        return fs_build(&self.b, p, n)

    cdef object build_checked(self, const unsigned char* p, Py_ssize_t n, object line, str what="row"):
        """Validate and build in one pass; on any doubt the scanner runs (today's exact error) and then ``build``."""
        cdef PyObject* v = fs_build_checked(&self.b, p, n)
        cdef object value
        cdef bint canonical
        if v != NULL:
            value = <object>v
            Py_DECREF(value)  # <object> took a reference of its own
            return value
        PyErr_Clear()  # building failed (memory, a limit): the two-pass way raises or builds it again
        _scan_json(p, n, &canonical, what, line)
        return fs_build(&self.b, p, n)


cdef _Builder _BUILDER = _Builder()


def loads_row(raw):
    """Decode a row's JSON bytes: any bytes give the value or a ProtocolError (they are validated first)."""
    cdef bytes data = raw
    return _loads_checked(<const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), "row", data)


cdef object _loads_row = loads_row


cdef object decode_row(object loads, object raw):
    """A held row decoded with the ``loads`` its parser left beside it.

    The codec's own parser leaves :func:`loads_row` with bytes it has
    already validated, so those go straight to the builder (which trusts its
    input); anything else is called.
    """
    if loads is _loads_row and type(raw) is bytes:
        return _BUILDER.build(<const unsigned char*>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
    return loads(raw)


cdef object _loads_checked(const unsigned char* p, Py_ssize_t n, str what, object line):
    cdef bint canonical
    _scan_json(p, n, &canonical, what, line)
    return _BUILDER.build(p, n)
