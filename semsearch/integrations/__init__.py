"""Adapters that make a semsearch index a retriever of RAG frameworks, each an optional extra:

    semsearch.integrations.langchain.SemsearchRetriever    pip install 'semsearch[langchain]'
    semsearch.integrations.llamaindex.SemsearchRetriever   pip install 'semsearch[llamaindex]'
    semsearch.integrations.haystack.SemsearchRetriever     pip install 'semsearch[haystack]'

Importing this package imports no framework; each module imports its own when imported.
"""
