"""Documents given with a call (`documents=`): block.py checks them and renders them into the
prompt (exact: an ordinary prompt); compose.py composes each document's KV, computed once, in
any order (`compose_documents=True`, opt-in, not exact). The document cache itself is
cache/documents.py."""
