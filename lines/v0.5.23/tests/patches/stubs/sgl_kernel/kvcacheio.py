from sgl_kernel import __getattr__  # noqa: F401  (same raising stand-in for the submodule)
