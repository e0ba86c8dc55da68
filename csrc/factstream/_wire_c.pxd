# What other compiled modules (the relay) call in the codec directly, without a Python call.

cdef object decode_row(object loads, object raw)
