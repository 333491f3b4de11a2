"""Start and stop `python -m sglang.launch_server` from the patched tree.

The server runs in its own process group (killed as a whole at stop), on a free port, with its log
in a file. `check_tree` refuses a tree without the patch, or an environment where `import sglang`
would not load the tree's copy.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import requests

from bench.errors import BenchError
from bench.run.host_sampling import ServerHost, triton_cache

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PATCH_MARKER = "speculative_disable_batch_size"
SM120_MARKER = "_is_sm120_supported"  # 0001 on the lines that run on a GPU (v0.5.9, v0.5.15)
# Flags that avoid pieces missing from the offline GPU bundle (ci/gpu/build-bundle.sh);
# override with $SGL_BASE_FLAGS (may be empty) on a fully installed box.
# --max-total-tokens: the tiny fixture models would otherwise give the target a KV pool of most of
# the GPU (mem-fraction-static 0.895) and leave too little for the draft's pool.
DEFAULT_BASE_FLAGS = (
    "--attention-backend triton --sampling-backend pytorch --grammar-backend none --max-total-tokens 400000"
)


class ServerError(BenchError):
    pass


class TreeError(BenchError):
    pass


def base_flags() -> list[str]:
    return shlex.split(os.environ.get("SGL_BASE_FLAGS", DEFAULT_BASE_FLAGS))


def line_tree(ref: str | None) -> Path:
    """The patched tree of the line a ref names: the toolkit decides (`python -m tools tree`)."""
    from tools.apply import resolve_ref
    from tools.project import Project

    project = Project(PROJECT_ROOT).line_for(ref)
    return project.tree_for(resolve_ref(project, ref))


def resolve_tree(tree: str | os.PathLike[str] | None = None, ref: str | None = None) -> Path:
    """--tree, else $SGLANG_TREE (an installed bundle), else the tree of the line --ref names."""
    t = Path(tree or os.environ.get("SGLANG_TREE") or line_tree(ref)).resolve()
    if not (t / "python" / "sglang" / "__init__.py").is_file():
        apply = f"make apply SGLANG_REF={ref}" if ref else "make apply"
        raise TreeError(f"no SGLang tree at {t} (needs python/sglang): run `{apply}` or set SGLANG_TREE")
    return t


def server_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(tree / "python") + (os.pathsep + old if old else "")
    env.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def _srt_text(tree: Path, relative: str) -> str:
    path = tree / "python" / "sglang" / "srt" / relative
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _server_args_text(tree: Path) -> str:
    """Where the tree's SGLang declares its ServerArgs fields: server_args.py, and from 0.5.23 on
    also the field groups in arg_groups/."""
    groups = tree / "python" / "sglang" / "srt" / "arg_groups"
    parts = [_srt_text(tree, "server_args.py")]
    parts += [p.read_text(encoding="utf-8") for p in sorted(groups.rglob("*.py"))] if groups.is_dir() else []
    return "\n".join(parts)


def tree_has_switch(tree: Path) -> bool:
    """Whether the tree carries the speculation switch (a line may drop it: lines/<ref>/NOTES.md)."""
    return PATCH_MARKER in _server_args_text(tree)


def _undeclared(text: str, names: list[str]) -> list[str]:
    return [n for n in names if not re.search(rf"\b{re.escape(n)}\b", text)]


def missing_server_args(tree: Path, names: list[str]) -> list[str]:
    """Those of the ServerArgs fields that the tree's SGLang does not declare."""
    return _undeclared(_server_args_text(tree), names)


def missing_environ(tree: Path, names: list[str]) -> list[str]:
    """Those of the environment variables that the tree's SGLang does not declare (srt/environ.py)."""
    return _undeclared(_srt_text(tree, "environ.py"), names)


def cuda_graph_max_bs_flag(tree: Path) -> str:
    """The flag that caps decode CUDA graph batch sizes: 0.5.15 renamed it (keeping the old name
    deprecated), 0.5.23 no longer accepts the old one."""
    renamed = not missing_server_args(tree, ["cuda_graph_max_bs_decode"])
    return "--cuda-graph-max-bs-decode" if renamed else "--cuda-graph-max-bs"


def check_tree(tree: Path, python: str = sys.executable, *, require_switch: bool = True) -> str:
    """Refuse an unpatched tree or a foreign `sglang`; return the imported sglang's path.
    require_switch False: a line's tree without the switch passes if it carries the SM120 patch."""
    has_switch = tree_has_switch(tree)
    if require_switch and not has_switch:
        sa = tree / "python" / "sglang" / "srt" / "server_args.py"
        raise TreeError(f"{tree} lacks the patch ({PATCH_MARKER} not in {sa}): run `make apply`")
    if not has_switch and SM120_MARKER not in _srt_text(tree, "layers/communicator.py"):
        raise TreeError(f"{tree} carries neither the switch nor the SM120 patch: run `make apply SGLANG_REF=<line>`")
    proc = subprocess.run(
        [python, "-c", "import sglang, sys; sys.stdout.write(sglang.__file__)"],
        env=server_env(tree),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise TreeError(f"`import sglang` failed with PYTHONPATH={tree / 'python'}:\n{proc.stderr[-3000:]}")
    imported = Path(proc.stdout.strip()).resolve()
    if (tree / "python").resolve() not in imported.parents:
        raise TreeError(
            f"the server would import sglang from {imported}, not from the patched tree {tree}; "
            "uninstall that sglang or fix PYTHONPATH"
        )
    return str(imported)


# SGLang 0.5.15+ derives its gRPC port as --port + 10000 and refuses to start when that passes 65535.
HIGHEST_SERVER_PORT = 65535 - 10000
LOWEST_SERVER_PORT = 20000
# SGLang 0.5.9 draws its NCCL port from --port + 100..1000.
DERIVED_PORT_SPAN = 1000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range for outgoing connections' local ports; None where it cannot be read."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def server_port_range(ephemeral: tuple[int, int] | None) -> tuple[int, int]:
    """Ports to draw --port from: below the ephemeral range where there is room.

    A port free when drawn can be taken, in the half minute before the server binds it, by any
    outgoing connection on the machine (the server's own NCCL and gloo set-up, the health probe's
    connects), which the kernel gives ports of the ephemeral range. On the H200 a server could not
    bind 54796 (inside Linux's default range, 32768-60999), free when it was drawn ("address
    already in use").
    """
    low, high = LOWEST_SERVER_PORT, HIGHEST_SERVER_PORT
    if ephemeral is not None:
        below = min(high, ephemeral[0] - 1 - DERIVED_PORT_SPAN)
        if below - low >= 1000:
            high = below
    return low, high


def free_port() -> int:
    """A free port that every supported SGLang release accepts as --port."""
    rng = random.Random()
    low, high = server_port_range(ephemeral_range())
    for _ in range(200):
        port = rng.randrange(low, high + 1)
        if _bindable(port):
            return port
    raise ServerError(f"no free port found in {low}..{high}")


@dataclass
class ServerSpec:
    model: str
    draft_model: str | None = None
    tp: int = 1
    flags: list[str] = field(default_factory=list)  # everything after --model-path/--port/--tp
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, port: int, python: str = sys.executable) -> list[str]:
        cmd = [
            python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tp",
            str(self.tp),
        ]
        if self.draft_model and "--speculative-algorithm" in self.flags:
            cmd += ["--speculative-draft-model-path", self.draft_model]
        return cmd + list(self.flags)


def _wait_group_gone(pgid: int, timeout: float) -> None:
    """Wait until no process of the group is left (GPU memory is freed only then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.2)


class Server:
    """A running server. Use as a context manager, or call start()/stop()."""

    def __init__(
        self, spec: ServerSpec, log_path: Path, tree: Path, *, port: int | None = None, python: str = sys.executable
    ) -> None:
        self.spec, self.log_path, self.tree, self.python = spec, Path(log_path), tree, python
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> ServerHost | None:
        """What a level reads of the server on the host: its process group (it starts a session of its
        own) and its Triton cache."""
        if self.proc is None:
            return None
        return ServerHost(self.proc.pid, triton_cache(server_env(self.tree, self.spec.env)))

    @property
    def command(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.spec.env.items())
        return (env + " " if env else "") + shlex.join(self.spec.argv(self.port, self.python))

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def start(self, timeout: float = 600.0) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log.write(f"$ {self.command}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.spec.argv(self.port, self.python),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_env(self.tree, self.spec.env),
            start_new_session=True,
        )
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"server exited with {self.proc.returncode} before it was healthy; log {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    # /health answers before the first generation works on some versions: probe once
                    r = requests.post(
                        self.url + "/generate",
                        json={"text": "hi", "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
                        timeout=120,
                    )
                    if r.status_code == 200:
                        return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        raise ServerError(f"server not healthy after {timeout:.0f}s; log {self.log_path}:\n" + self.log_tail())

    def stop(self, grace: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    continue
                # the leader is gone; children (TP ranks, detokenizer) may linger in the group
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            _wait_group_gone(proc.pid, 30.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "Server":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
