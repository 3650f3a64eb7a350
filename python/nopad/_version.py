# The package version: the library's (include/nopad.h NOPAD_VERSION_*); a test checks they agree.
__version__ = "0.1.0"
