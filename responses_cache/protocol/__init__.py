"""Wire types of the Responses API (msgspec Structs) and their codecs."""
