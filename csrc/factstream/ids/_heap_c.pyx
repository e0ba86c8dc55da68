# distutils: language = c++
# cython: language_level=3
"""The pending-completion heap, compiled twin of ``factstream.ids._heap_py``.

Same names, behaviour, error types and messages; see the pure twin for the
specification. Storage: a binary min-heap of tracked ids in a C++ vector and
an open-addressing hash table id -> state (linear probing, Fibonacci hashing,
backward-shift deletion, load <= 1/2), which avoids a heap allocation per id.
"""

from libc.stdint cimport int64_t, uint64_t, uint8_t
from libcpp.vector cimport vector

__all__ = ["PendingHeap", "INT64_MIN", "INT64_MAX"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


cdef inline object _range_error():
    return OverflowError("stream id out of the signed 64-bit range")


cdef class PendingHeap:
    """Reserved-but-incomplete ids of one writer, and its position (see ``_heap_py``)."""

    # Invariant: _heap[0] (if any) is pending; ids below it are settled.
    cdef int64_t _position
    cdef vector[int64_t] _heap
    # hash table of tracked ids: _keys[i] valid where _state[i] != EMPTY (3: being completed)
    cdef vector[int64_t] _keys
    cdef vector[uint8_t] _state
    cdef uint64_t _mask
    cdef int _shift
    cdef Py_ssize_t _used
    cdef Py_ssize_t _pending
    cdef vector[int64_t] _holds             # few at a time: linear scans

    def __init__(self, position=1):
        self._position = self._as_id(position)
        self._pending = 0
        self._alloc(16)

    # -- hash table (EMPTY=0, PENDING=1, DONE=2; 3 only inside complete_many)

    cdef void _alloc(self, Py_ssize_t cap) noexcept:
        cdef int bits = 0
        while (<Py_ssize_t>1 << bits) < cap:
            bits += 1
        self._keys.assign(<size_t>1 << bits, 0)
        self._state.assign(<size_t>1 << bits, 0)
        self._mask = (<uint64_t>1 << bits) - 1
        self._shift = 64 - bits
        self._used = 0

    cdef inline uint64_t _home(self, int64_t key) noexcept:
        return (<uint64_t>key * <uint64_t>0x9E3779B97F4A7C15ULL) >> self._shift

    cdef inline Py_ssize_t _find(self, int64_t key) noexcept:
        cdef uint64_t i = self._home(key)
        cdef uint8_t* st = self._state.data()
        cdef int64_t* ks = self._keys.data()
        while st[i] != 0:
            if ks[i] == key:
                return <Py_ssize_t>i
            i = (i + 1) & self._mask
        return -1

    cdef void _put(self, int64_t key, uint8_t state) noexcept:
        # key must be absent
        cdef vector[int64_t] old_keys
        cdef vector[uint8_t] old_state
        cdef size_t j
        if 2 * (self._used + 1) > <Py_ssize_t>(self._mask + 1):
            old_keys.swap(self._keys)
            old_state.swap(self._state)
            self._alloc(2 * (self._mask + 1))
            for j in range(old_keys.size()):
                if old_state[j] != 0:
                    self._put(old_keys[j], old_state[j])
        cdef uint64_t i = self._home(key)
        cdef uint8_t* st = self._state.data()
        while st[i] != 0:
            i = (i + 1) & self._mask
        st[i] = state
        self._keys[i] = key
        self._used += 1

    cdef void _erase_at(self, Py_ssize_t slot) noexcept:
        cdef uint64_t i = <uint64_t>slot
        cdef uint64_t j = i
        cdef uint64_t k
        cdef uint8_t* st = self._state.data()
        cdef int64_t* ks = self._keys.data()
        while True:
            j = (j + 1) & self._mask
            if st[j] == 0:
                break
            k = self._home(ks[j])
            # the entry at j may stay if its home lies cyclically in (i, j]
            if (i <= j and i < k and k <= j) or (i > j and (i < k or k <= j)):
                continue
            ks[i] = ks[j]
            st[i] = st[j]
            i = j
        st[i] = 0
        self._used -= 1

    cdef inline int64_t _as_id(self, object value) except? -1:
        cdef int64_t out
        try:
            out = value
        except OverflowError:
            raise _range_error() from None
        return out

    @property
    def position(self):
        """The writer's current position."""
        return self._position

    @property
    def pending(self):
        """How many reserved ids have not completed."""
        return self._pending

    def __len__(self):
        return self._heap.size()

    @property
    def holds(self):
        """How many holds (ids on their way) are in place."""
        return self._holds.size()

    def is_idle(self):
        """True when nothing is in flight (the position may then jump)."""
        return self._heap.size() == 0 and self._holds.size() == 0

    def hold(self, bound):
        """An id is on its way and will be larger than ``bound``: keep the position at or below it."""
        cdef int64_t b = self._as_id(bound)
        if b < self._position:
            raise ValueError(f"hold bound {b} is below the position {self._position}")
        self._holds.push_back(b)

    def release(self, bound):
        """Drop one hold at ``bound``; the new position, or None."""
        cdef int64_t b = self._as_id(bound)
        cdef size_t i
        for i in range(self._holds.size()):
            if self._holds[i] == b:
                self._holds.erase(self._holds.begin() + i)
                return self._absorb()
        raise ValueError(f"no hold at {b}")

    def lowest_pending(self):
        """The smallest pending id (which holds the position back), or None."""
        if self._heap.size() == 0:
            return None
        return self._heap[0]

    def is_pending(self, stream_id):
        """Whether ``stream_id`` is reserved and not completed."""
        cdef Py_ssize_t slot = self._find(self._as_id(stream_id))
        return slot >= 0 and self._state[slot] == 1

    def pending_ids(self):
        """The pending ids, ascending."""
        cdef size_t i
        out = [self._keys[i] for i in range(self._state.size()) if self._state[i] == 1]
        out.sort()
        return out

    # -- heap primitives (min-heap on int64)

    cdef inline void _push(self, int64_t value) noexcept:
        cdef Py_ssize_t i = self._heap.size()
        cdef Py_ssize_t parent
        self._heap.push_back(value)
        cdef int64_t* h = self._heap.data()
        while i > 0:
            parent = (i - 1) >> 1
            if h[parent] <= value:
                break
            h[i] = h[parent]
            i = parent
        h[i] = value

    cdef inline int64_t _pop(self) noexcept:
        cdef int64_t* h = self._heap.data()
        cdef int64_t top = h[0]
        cdef int64_t last = h[self._heap.size() - 1]
        self._heap.pop_back()
        cdef Py_ssize_t n = self._heap.size()
        cdef Py_ssize_t i = 0
        cdef Py_ssize_t child
        if n == 0:
            return top
        h = self._heap.data()
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and h[child + 1] < h[child]:
                child += 1
            if h[child] >= last:
                break
            h[i] = h[child]
            i = child
        h[i] = last
        return top

    # -- API

    cdef int _check_reservable(self, int64_t sid) except -1:
        if sid <= self._position:
            raise ValueError(f"stream id {sid} is at or below the position {self._position}")
        if self._find(sid) >= 0:
            raise ValueError(f"stream id {sid} is already reserved")
        return 0

    def reserve(self, stream_id):
        """Register ``stream_id`` as reserved by this writer."""
        cdef int64_t sid = self._as_id(stream_id)
        self._check_reservable(sid)
        self._put(sid, 1)
        self._pending += 1
        self._push(sid)

    def reserve_many(self, stream_ids):
        """Reserve several ids (all checked first: on error nothing is reserved)."""
        # Each id enters the table as it is checked, so a repeat is found there (no set of its
        # own); an error takes the ones entered out again before it propagates.
        cdef vector[int64_t] ids
        cdef int64_t sid
        try:
            for value in stream_ids:
                sid = self._as_id(value)
                self._check_reservable(sid)
                self._put(sid, 1)
                ids.push_back(sid)
        except BaseException:
            for sid in ids:
                self._erase_at(self._find(sid))
            raise
        for sid in ids:
            self._push(sid)
        self._pending += ids.size()

    cdef Py_ssize_t _check_completable(self, int64_t sid) except -1:
        cdef Py_ssize_t slot = self._find(sid)
        if slot < 0:
            raise ValueError(f"stream id {sid} was not reserved")
        if self._state[slot] != 1:
            raise ValueError(f"stream id {sid} is already completed")
        return slot

    def complete(self, stream_id):
        """Mark ``stream_id`` finished (committed or failed); the new position, or None."""
        cdef Py_ssize_t slot = self._check_completable(self._as_id(stream_id))
        self._state[slot] = 2
        self._pending -= 1
        return self._absorb()

    def complete_many(self, stream_ids):
        """Complete several ids (all checked first); the new position, or None."""
        # Checked ids are marked (state 3) in the table, so a repeat reads as completed; an
        # error marks them pending again before it propagates. No insert or erase happens
        # meanwhile, so the slots stay where they are.
        cdef vector[Py_ssize_t] slots
        cdef Py_ssize_t slot
        cdef uint8_t* st
        try:
            for value in stream_ids:
                slot = self._check_completable(self._as_id(value))
                self._state[slot] = 3
                slots.push_back(slot)
        except BaseException:
            st = self._state.data()
            for slot in slots:
                st[slot] = 1
            raise
        st = self._state.data()
        for slot in slots:
            st[slot] = 2
        self._pending -= slots.size()
        return self._absorb()

    cdef object _absorb(self):
        cdef bint moved = False
        cdef int64_t sid
        cdef int64_t limit = 0x7FFFFFFFFFFFFFFF
        cdef size_t i
        for i in range(self._holds.size()):
            if self._holds[i] < limit:
                limit = self._holds[i]
        cdef Py_ssize_t slot
        while self._heap.size() > 0 and self._heap[0] <= limit:
            slot = self._find(self._heap[0])
            if self._state[slot] != 2:
                break
            sid = self._pop()
            self._erase_at(slot)
            self._position = sid
            moved = True
        if moved:
            return self._position
        return None

    def advance(self, new_position):
        """Move an idle writer's position up to ``new_position``; the new position, or None."""
        cdef int64_t pos = self._as_id(new_position)
        if self._heap.size() > 0 or self._holds.size() > 0 or pos <= self._position:
            return None
        self._position = pos
        return pos

    def __repr__(self):
        return (
            f"PendingHeap(position={self._position}, pending={self._pending}, tracked={self._heap.size()}, "
            f"holds={self._holds.size()})"
        )
