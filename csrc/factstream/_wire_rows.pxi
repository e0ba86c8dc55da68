# A held row's items for the relay's typed rows (``include``d by _wire_c.pyx, after the builder it uses):
# a row class is filled straight from the values of the row's JSON array, with no list built for the
# array (nor for the one nested array of an events-style ``[kind, fields]`` row) only to be read and freed.

cdef extern from *:
    r"""
    /* The items of the validated JSON array at *pp ('['), as new references in items[0..k): k, or -1 with
       nothing kept when it has more than `most`. With nest_at >= 0 the item at that index must be an array
       too (else -1): its items go to nested the same way (count in *nested_n) and items[nest_at] is NULL.
       -2 with the error set when building a value failed. */
    static Py_ssize_t fs_b_items(fs_builder *b, const unsigned char **pp, PyObject **items, Py_ssize_t most,
                                 Py_ssize_t nest_at, PyObject **nested, Py_ssize_t nested_most,
                                 Py_ssize_t *nested_n) {
        const unsigned char *p = fs_b_ws(b, *pp + 1);
        Py_ssize_t k = 0, r = -1, i, m = -1;
        PyObject *v;
        if (*p == ']') {
            *pp = p + 1;
            return nest_at >= 0 ? -1 : 0;
        }
        for (;;) {
            if (k == most)
                goto release;  /* more items than the caller takes */
            *pp = p;
            if (k == nest_at) {
                if (*p != '[')
                    goto release;
                m = fs_b_items(b, pp, nested, nested_most, -1, NULL, 0, NULL);
                if (m < 0) {
                    r = m;
                    m = -1;
                    goto release;
                }
                items[k++] = NULL;
            } else {
                v = fs_b_value(b, pp);  /* inlined: strings and constants without a call */
                if (v == NULL) {
                    r = -2;
                    goto release;
                }
                items[k++] = v;
            }
            p = fs_b_ws(b, *pp);
            if (*p == ',') {
                p = fs_b_ws(b, p + 1);
                continue;
            }
            *pp = p + 1;  /* ] */
            if (nest_at >= k)
                goto release;  /* too short to hold the nested array */
            if (nested_n != NULL)
                *nested_n = m;
            return k;
        }
    release:
        for (i = 0; i < k; i++)
            Py_XDECREF(items[i]);
        for (i = 0; i < m; i++)
            Py_DECREF(nested[i]);
        return r;
    }
    """
    Py_ssize_t fs_b_items(fs_builder* b, const unsigned char** pp, PyObject** items, Py_ssize_t most,
                          Py_ssize_t nest_at, PyObject** nested, Py_ssize_t nested_most, Py_ssize_t* nested_n)
    const unsigned char* fs_b_ws(const fs_builder* b, const unsigned char* p)


cdef Py_ssize_t decode_row_items(object loads, object raw, PyObject** items, Py_ssize_t most, Py_ssize_t nest_at,
                                 PyObject** nested, Py_ssize_t nested_most, Py_ssize_t* nested_n) except -2:
    """The items of a held row (``decode_row``'s value) when it is a JSON array of at most ``most`` items.

    New references in ``items``; with ``nest_at >= 0`` the item at that index must be an array whose items
    (at most ``nested_most``) go to ``nested`` instead (``items[nest_at]`` is then NULL). -1, nothing
    kept, for any other shape, and for bytes the codec did not validate itself (``decode_row`` decides).
    """
    cdef const unsigned char* p
    cdef const unsigned char* end
    if loads is not _loads_row or type(raw) is not bytes or _BUILDER.b.defer:
        return -1  # not bytes this codec checked, or inside a feed (whose holding rules the builder follows)
    p = <const unsigned char*>PyBytes_AS_STRING(raw)
    end = p + PyBytes_GET_SIZE(raw)
    _BUILDER.b.end = end
    p = fs_b_ws(&_BUILDER.b, p)
    if p >= end or p[0] != 91:  # not an array
        return -1
    return fs_b_items(&_BUILDER.b, &p, items, most, nest_at, nested, nested_most, nested_n)  # -2: error set
