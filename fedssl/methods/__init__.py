"""Method plugins: one module or package per method, found and registered by
:mod:`fedssl.methods.registry`. Nothing outside this package branches on the method."""
