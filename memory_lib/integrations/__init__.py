"""Faces of the library for agent frameworks, each over the public client and each an optional extra:
``memory_lib.integrations.mcp`` (``pip install 'memory-archive[mcp]'``) and
``memory_lib.integrations.langgraph`` (``'memory-archive[langgraph]'``). Nothing here is imported by the
rest of the library, so the core install never needs them."""
