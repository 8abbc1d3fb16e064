"""Vector stores for RAG frameworks, over an embedded ``vindex.Index`` or a ``vindex.Client`` collection.

Each lives in its own module and imports its framework only when imported itself:
``vindex.integrations.langchain`` (extra ``vindex[langchain]``) and
``vindex.integrations.llama_index`` (extra ``vindex[llamaindex]``).
"""
