"""A stand-in for torchvision, for one test: `python -m sglang.bench_serving` on a machine without GPU.

Why: sglang 0.5.23's bench_serving imports torchvision without using it for a text benchmark
(sglang.benchmark.serving -> sglang.srt.disaggregation.utils -> sglang.srt.configs ->
nano_nemotron_vl -> multimodal.internvl_utils: `import torchvision.transforms as T`; and
transformers' image utilities once torchvision is importable). The only torchvision wheels the
package index has are CUDA builds, which cannot load beside the CPU torch of the test venv
(`_C.so` needs libc10_cuda.so, and the failed load then makes `import torchvision` raise
"operator torchvision::nms does not exist"): a hardware boundary.

What: every `torchvision.*` module and name imports; using any of them raises, so a code path
that really needed torchvision would fail the test instead of being faked. tests/e2e/test_bench_serving.py
puts this directory on PYTHONPATH only when no real torchvision imports.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+sparkit-standin"
STANDIN = True


class _Unavailable(type):
    """A placeholder class: attributes give more placeholders, calling one raises."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__qualname__}: torchvision is a stand-in here (tests/e2e/standins); "
                           "this code path needs the real torchvision")


def _placeholder(name: str) -> type:
    return _Unavailable(name.rsplit(".", 1)[-1], (), {"__qualname__": name})


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _StandinModule
