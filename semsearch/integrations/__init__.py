"""Adapters that make a semsearch index a retriever of RAG frameworks, each an optional extra:

    semsearch.integrations.langchain.SemsearchRetriever    pip install 'semsearch[langchain]'
    semsearch.integrations.langchain.SemsearchVectorStore  (the same extra: add / delete / search documents)
    semsearch.integrations.llamaindex.SemsearchRetriever   pip install 'semsearch[llamaindex]'
    semsearch.integrations.llamaindex.SemsearchVectorStore (the same extra: add / delete / query nodes)
    semsearch.integrations.haystack.SemsearchRetriever     pip install 'semsearch[haystack]'
    semsearch.integrations.haystack.SemsearchDocumentStore (the same extra: write / filter / delete documents)

Importing this package imports no framework; each module imports its own when imported. Every
async entry point (ainvoke, abatch, the vector store's a* methods, Haystack's run_async, LlamaIndex's
aretrieve) runs the search on a worker thread, never on the event loop. See docs/integrations.md.
"""
