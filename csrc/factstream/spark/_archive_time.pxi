# Included by _archive_c.pyx (textually: cdef functions are inlined across it).
# ISO-8601 prefix lengths and text -> microseconds for ts/date, as spark.timestamps does.

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
