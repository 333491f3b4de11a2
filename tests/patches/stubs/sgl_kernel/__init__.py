"""Import-time stand-in for SGLang's native kernel library on machines without a GPU.

SGLang 0.5.9 imports a few `sgl_kernel` names at module level on code paths the CPU tests use
(e.g. `mem_cache/memory_pool_host.py`). Any name resolves to a function that raises when called,
so a test that reaches a native kernel fails loudly instead of computing something wrong.
"""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _native_kernel_unavailable(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is a native GPU kernel; the CPU test stub cannot run it")

    _native_kernel_unavailable.__name__ = name
    return _native_kernel_unavailable
