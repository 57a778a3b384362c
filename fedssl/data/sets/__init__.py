"""The data sets, one drop-in file each: a module here registers its
:class:`~fedssl.data.catalog.DatasetSpec` (and may hold its reader); the registry imports every
module here (see :mod:`fedssl.data.catalog`)."""
