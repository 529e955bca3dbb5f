"""Which variables a recipe's `server.env` may set as plain settings: an allowlist.

A variable such as OPENSSL_CONF, PYTHONPATH, LD_PRELOAD or CUDA_INJECTION64_PATH makes the engine
load code from where it points, and the startup checks cannot tell that code from the engine's own;
so can one that moves where the engine reads compiled kernels or caches from (TRITON_CACHE_DIR,
HOME, XDG_CACHE_HOME). A list of such variables always misses one, so the list is of the others:
each engine adapter declares the families of variables its engine reads as settings
(`EngineEnvironment`: SGLang's registry, PyTorch, CUDA, NCCL, Triton, ...), and every other
variable in a recipe's `server.env` needs the recipe's `server.allow_code_env` to name it. Within
a family, a variable that names a file, a directory, a library or a module (`TRITON_LIBCUDA_PATH`,
`TRITON_HOME`, `PYTORCH_KERNEL_CACHE_PATH`: PATH_SUFFIXES) needs it too, and so does one the
family's engine is known to import code through (KNOWN_CODE_ENV). The environment a user exported
in the shell that runs sparkit is theirs, and passes through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Variables known to make a process load code (or read compiled code) from where they point, with
# what they load: the explanation a refusal gives. Whether a variable needs the opt-in is decided
# by the allowlist (EngineEnvironment.needs_opt_in), not by this table.
KNOWN_CODE_ENV: dict[str, str] = {
    "PYTHONPATH": "Python imports modules (and a sitecustomize.py) from these directories first",
    "PYTHONHOME": "Python's standard library is read from this directory",
    "PYTHONSTARTUP": "Python runs this file at an interactive start",
    "PYTHONUSERBASE": "Python imports user site-packages (and their .pth files) from here",
    "PYTHONPLATLIBDIR": "Python's platform library directory name",
    "PYTHONEXECUTABLE": "the interpreter Python reports as sys.executable (child processes run it)",
    "PYTHONPYCACHEPREFIX": "Python loads compiled modules (.pyc) from this directory",
    "PYTHONBREAKPOINT": "Python imports and calls this on breakpoint()",
    "PYTHONWARNINGS": "Python imports the module of each warning category named here",
    "LD_PRELOAD": "the dynamic linker loads these libraries into every process",
    "LD_LIBRARY_PATH": "the dynamic linker looks for libraries here first",
    "LD_AUDIT": "the dynamic linker loads these auditing libraries",
    "GCONV_PATH": "glibc loads character-set conversion modules from here",
    "GLIBC_TUNABLES": "glibc's allocator and loader settings (a past local root exploit's way in)",
    "OPENSSL_CONF": "OpenSSL reads this configuration file, which can load provider and engine modules",
    "OPENSSL_MODULES": "OpenSSL loads provider modules from this directory",
    "PATH": "every program the engine runs (a compiler, nvidia-smi, ninja) is looked up here",
    "HOME": "where ~/.cache, ~/.triton and ~/.nv are: compiled kernels and caches the engine loads",
    "XDG_CACHE_HOME": "where the cache directories are: compiled kernels and caches the engine loads",
    "TMPDIR": "where the engine's temporary files go, compiled kernels among them",
    "CC": "the C compiler Triton and PyTorch run to build their launchers",
    "CXX": "the C++ compiler Humming and PyTorch run to build extensions",
    "CUDA_INJECTION64_PATH": "the CUDA driver loads this library into the process",
    "CUDA_INJECTION32_PATH": "the CUDA driver loads this library into the process",
    "CUDA_CACHE_PATH": "the CUDA driver loads JIT-compiled kernels from here",
    "NCCL_NET_PLUGIN": "NCCL loads this network plugin library",
    "NCCL_TUNER_PLUGIN": "NCCL loads this tuner plugin library",
    "NCCL_PROFILER_PLUGIN": "NCCL loads this profiler plugin library",
    "NCCL_ENV_PLUGIN": "NCCL loads this environment plugin library",
    "TORCH_EXTENSIONS_DIR": "PyTorch loads compiled extensions from here",
    "TORCHINDUCTOR_CACHE_DIR": "PyTorch's compiler loads cached compiled kernels from here",
    "TRITON_CACHE_DIR": "Triton loads cached compiled kernels from here",
    "TRITON_HOME": "Triton's cache (compiled kernels) lives under this directory",
    "TRITON_CACHE_MANAGER": "Triton imports this module:class as its cache manager",
    "TRITON_REMOTE_CACHE_BACKEND": "Triton imports this module:class as its remote cache",
    "TRITON_KERNEL_OVERRIDE": "Triton replaces compiled kernels with the files in its override directory",
    "TRITON_SWAP_MIR": "Triton replaces compiled kernels with the MIR files in this directory",
    "HF_HOME": "where the Hugging Face cache is: models and the remote code transformers imports",
    "HF_MODULES_CACHE": "transformers imports remote-code modules from here",
}
# Name prefixes of the same: every variable that starts with one of them.
KNOWN_CODE_ENV_PREFIXES: dict[str, str] = {
    "LD_": "the dynamic linker's settings (libraries it loads, where it looks)",
    "DYLD_": "the macOS dynamic linker loads libraries from what these name",
    "PYTHON": "the Python interpreter's own settings (what it imports, from where)",
}

# Within a family, a variable whose name ends so names where something is read from (a file, a
# directory, a library, a module, a program): it needs the opt-in like any code-loading variable.
PATH_SUFFIXES = ("_PATH", "_PATHS", "_DIR", "_DIRS", "_DIRECTORY", "_HOME", "_ROOT", "_FILE", "_FILES",
                 "_LIB", "_LIBS", "_LIBRARY", "_LIBRARIES", "_PACKAGE", "_MODULE", "_BIN", "_EXE", "_CMD", "_COMMAND", "_PREFIX")


@dataclass(frozen=True)
class EnvFamily:
    """Variables one component reads as its settings: names starting with one of `prefixes`, and
    the exact `names`."""

    name: str  # what reads them, for messages ("NCCL")
    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()

    def covers(self, variable: str) -> bool:
        return variable in self.names or variable.startswith(self.prefixes)


# The families both built-in engines read: the libraries under them, and sparkit's own switches.
TORCH_ENV = EnvFamily("PyTorch", ("TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "ATEN_", "OMP_", "MKL_",
                                  "KMP_"))
CUDA_ENV = EnvFamily("CUDA", ("CUDA_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "NVIDIA_", "NVSHMEM_"))
NCCL_ENV = EnvFamily("NCCL", ("NCCL_",))
TRITON_ENV = EnvFamily("Triton", ("TRITON_",))
HUGGING_FACE_ENV = EnvFamily("Hugging Face's offline and logging switches", names=frozenset({
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_XET", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_ETAG_TIMEOUT",
    "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_VERBOSITY", "TRANSFORMERS_VERBOSITY", "TOKENIZERS_PARALLELISM",
}))
SPARKIT_ENV = EnvFamily("sparkit's own switches", ("SPARKIT_",))


@dataclass(frozen=True)
class EngineEnvironment:
    """What an engine reads from its environment as settings (its adapter's `environment()`): a
    recipe may set these in `server.env`; any other variable needs `server.allow_code_env`."""

    families: tuple[EnvFamily, ...]
    # Variables inside the families that still load code (an engine's own module:attr settings), with why.
    code: dict[str, str] = field(default_factory=dict)
    source: str = ""  # where the families came from ("sglang 0.5.23's registry (770 names)")

    def needs_opt_in(self, variable: str) -> str | None:
        """Why setting `variable` in a recipe needs `server.allow_code_env`; None when it is one
        of the engine's settings."""
        known = code_loading(variable)
        if known is not None:
            return known
        if variable in self.code:
            return self.code[variable]
        family = next((f for f in self.families if f.covers(variable)), None)
        if family is None:
            return "not a setting of " + ", ".join(f.name for f in self.families) + " (the engine's allowlist)"
        if variable.endswith(PATH_SUFFIXES):
            return f"names a file, directory, library or module that {family.name} reads"
        return None


def code_loading(variable: str) -> str | None:
    """What a variable known to load code makes a process load (KNOWN_CODE_ENV); else None."""
    if variable in KNOWN_CODE_ENV:
        return KNOWN_CODE_ENV[variable]
    return next((why for prefix, why in KNOWN_CODE_ENV_PREFIXES.items() if variable.startswith(prefix)), None)


# What an engine adapter without an `environment()` is taken to read: the libraries under every
# engine sparkit knows, and sparkit's own switches.
COMMON_ENVIRONMENT = EngineEnvironment((TORCH_ENV, CUDA_ENV, NCCL_ENV, TRITON_ENV, HUGGING_FACE_ENV, SPARKIT_ENV),
                                       source="the families every engine reads")
