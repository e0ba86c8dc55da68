# Included by _archive_c.pyx (textually: cdef functions are inlined across it).
# The JSON and header scanners the fast path reads RDATA bodies with, in C, no Python objects.

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
