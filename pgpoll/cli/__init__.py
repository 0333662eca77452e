"""The ``pgpoll`` command line: parses options, calls the library, formats, exits."""
