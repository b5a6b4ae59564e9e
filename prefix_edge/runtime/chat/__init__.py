"""Chat above the engines: messages rendered to ids (render.py), Conversation, tools, and user
text kept apart from the template's control tokens."""
