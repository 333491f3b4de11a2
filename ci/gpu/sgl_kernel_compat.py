# --- appended to sgl_kernel/__init__.py by the bundle's setup.sh: the SGLang release in the tree
# imports some names from an older sgl-kernel than the one the bundle carries. Importing such a name
# succeeds; calling it raises, so a code path that really needs it fails loudly, not silently.
def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not in the sglang-kernel this bundle carries")

    missing.__name__ = name
    return missing
