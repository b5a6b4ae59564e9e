"""Documents given with a call (`documents=`): plan.py decides once, at the call, where they go
and whether they are composed; block.py checks them and renders them into the
prompt (exact: an ordinary prompt); compose.py composes each document's KV, computed once, in
any order (`compose_documents=True`, opt-in, not exact). The document cache itself is
cache/documents.py."""
