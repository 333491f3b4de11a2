"""Running what is measured: the command line's settings, SGLang servers, and the HTTP load."""
