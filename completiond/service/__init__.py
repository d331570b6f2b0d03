"""The daemon and its wire: sockets, sessions, handlers, documents, workspace."""
