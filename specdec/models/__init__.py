"""The models people run: the registry, fetching and checking them (`hub`), and llama.cpp on
the same files where its Python binding is installed, for side-by-side figures (`llamacpp`)."""
