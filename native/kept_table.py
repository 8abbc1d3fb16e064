"""Layout of the RocksDB store's table of kept postings, shared by the kernels
(``native.kept``) and the library (``vindex.storage``); no numba import here, so opening an
index does not load numba."""

#: The kept table's columns: the entry's first row (-1: none kept), its rows, the posting's
#: span word and ``generation << 1 | lead`` when it was kept, the entry's number.
START, ROWS, SPAN, GEN, SEQ = range(5)
#: A span word is ``first chunk << 32 | chunk count``.
CHUNKS_MASK = (1 << 32) - 1
