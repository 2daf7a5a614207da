"""The lexical index: BM25 over chunk text, in a posting file beside each segment's docstore.

A writer analyses each chunk as it is added (its context and text, store/docstore.py) and keeps
its terms (64-bit term hashes and their counts) in memory until the segment's commit, which
inverts them into the segment's posting file (`lexical.<s>.bin`, below) in the same publish as
its text, so the lexical and dense sides of an index cannot disagree after an update or a
delete. Since format 5 the docstore keeps no copy of them (its `chunks.lex` column stays empty:
2.5 KB a chunk of 200 words as SQLite stored them); merges and re-pooling writes take the posting files' rows as they
are (write_segment_file). Docstores of older formats still hold their terms there and are read
from it where they have no posting file.

Why not SQLite FTS5, which the docstore could hold as well: measured on SciFact (5,183 docs),
FTS5's bm25() ranks an OR-query in ~6 ms p50 on a quiet 2-core machine (it scores each of the
~2,800 matching rows through its auxiliary-function API) against ~0.35 ms for the posting arrays
here, and its k1/b and IDF are fixed (the IDF of a term in more than half the rows is clamped to
~0). `scripts/bench/bench_hybrid.py` measures both, quality and speed, in one run.
Why not a BM25 package (rank-bm25, bm25s, Pyserini): none stores its index incrementally in the
docstore's transaction, and Pyserini needs a JVM. The analysis is Lucene's English recipe
(lower-case, stop words, Porter2 stemming from the Snowball project's stemmer).

The package, by concern: `analysis` (words, stop words, stems, term hashes), `postings` (posting
sets in memory and in a posting file: the format and its reading), `scoring` (BM25, pruning),
`writing` (writing and merging posting files). Its names are re-exported here.
"""
from __future__ import annotations

from semsearch.store.lexical import analysis
from semsearch.store.lexical import postings
from semsearch.store.lexical import scoring
from semsearch.store.lexical import writing
from semsearch.store.lexical.analysis import (
    ANALYZER, QUESTION_WORDS, STOPWORDS, terms, encode_terms, encode_terms_many, decode_terms, counted,
)
from semsearch.store.lexical.postings import (
    BLOCK, Postings, ARRAYS, DTYPES, has_terms, add_columns, invert, FILE_MAGIC, FILE_MAGIC_1, TF_ESCAPE, KEPT, WHOLE_AT,
    PackedPostings, open_file, release, file_name, load,
)
from semsearch.store.lexical.scoring import (
    K1, B, MAX_TERMS, SPARSE_MAX, best_n, Pruned, LexicalIndex,
)
from semsearch.store.lexical.writing import (
    BATCH, SPAN, SMALL_FILE, write_file, write_segment_file, write_merged, write_file_v1,
)

__all__ = ["analysis", "postings", "scoring", "writing",
           "ANALYZER", "QUESTION_WORDS", "STOPWORDS", "terms", "encode_terms", "encode_terms_many", "decode_terms", "counted",
           "BLOCK", "Postings", "ARRAYS", "DTYPES", "has_terms", "add_columns", "invert", "FILE_MAGIC",
           "FILE_MAGIC_1", "TF_ESCAPE", "KEPT", "WHOLE_AT", "PackedPostings", "open_file", "release",
           "file_name", "load", "K1", "B", "MAX_TERMS", "SPARSE_MAX", "best_n", "Pruned", "LexicalIndex",
           "BATCH", "SPAN", "SMALL_FILE", "write_file", "write_segment_file", "write_merged", "write_file_v1"]
