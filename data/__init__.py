"""The data sets bundled with vindex (licences in NOTICE.md); read them with importlib.resources."""
