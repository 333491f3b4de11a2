"""Stand-in for a package the offline bundle cannot carry (too large to travel), written into the
bundle by build-bundle.sh for each 'stub-package:NAME' line of its wheel list.

SGLang imports some packages on paths that only need the import to succeed (an isinstance check
against a backend class defined in a module that imports them). Here, importing the package or any
submodule succeeds, attributes resolve to placeholders, and a placeholder used as a decorator gives
a function; calling anything else, or what a decorator gave, raises ModuleNotFoundError naming the
package. So a code path that really needs the package fails loudly.
"""

import importlib.abc
import importlib.machinery
import sys
import types

_PACKAGE = __name__


def _missing(what):
    return ModuleNotFoundError(f"{what}: the package {_PACKAGE!r} is a stand-in in this offline bundle")


class _Placeholder:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            decorated = f"{self._name}({getattr(args[0], '__qualname__', args[0])})"

            def unavailable(*a, **k):
                raise _missing(decorated)

            return unavailable
        raise _missing(self._name)

    def __getitem__(self, item):  # type annotations such as Type[Numeric]
        return _Placeholder(f"{self._name}[...]")

    def __or__(self, other):  # annotations such as A | None
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(_PACKAGE + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Placeholder(f"{_PACKAGE}.{attr}")


sys.meta_path.append(_Finder())
