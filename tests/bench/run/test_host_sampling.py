"""A server's processes on the host over a level, read from a real process group's /proc."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import run_fake_bench  # noqa: E402

from bench.results import host_use  # noqa: E402
from bench.results.records import LevelRecord, read_results  # noqa: E402
from bench.run import host_sampling  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")

# A scheduler-like process: named as SGLang names one, its main thread asleep while another thread
# spins for half a second once told to.
SERVER = textwrap.dedent(
    """
    import ctypes, sys, threading, time
    libc = ctypes.CDLL(None)
    libc.prctl(15, b"sglang::scheduler_TP0")  # PR_SET_NAME, as setproctitle does
    def spin():
        libc.prctl(15, b"busy-neighbour")
        sys.stdin.readline()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
        print("done", flush=True)
        time.sleep(30)  # alive when sampled
    threading.Thread(target=spin, daemon=True).start()
    print("ready", flush=True)
    time.sleep(30)
    """
)


@pytest.fixture
def server() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_a_busy_thread_beside_the_schedulers_main_thread_shows_with_its_cpu_time(
    server: subprocess.Popen[str],
) -> None:
    assert server.stdin is not None and server.stdout is not None
    before = host_sampling.group(server.pid)
    server.stdin.write("go\n")
    server.stdin.flush()
    assert server.stdout.readline() == "done\n"
    (use,) = host_sampling.use_between(before, host_sampling.group(server.pid))
    assert use.name == "sglang::schedul"  # the kernel keeps 15 characters of it
    assert use.busiest_other == "busy-neighbour"
    assert use.busiest_other_cpu_s >= 0.3
    assert use.main_cpu_s < 0.1
    assert use.cpu_s >= use.busiest_other_cpu_s
    assert use.threads == 2 and use.rss_mb > 1

    level = LevelRecord(concurrency=2, requests=6, output_tokens=100, wall_s=0.5, tok_per_s=200.0, host=(use,))
    assert LevelRecord.from_json(level.to_json(), "level") == level
    table = host_use.section({"spec-v2": [(2, 0.5, (use,))]})
    (row,) = [line for line in table if line.startswith("| spec-v2")]
    assert f"busy-neighbour {use.busiest_other_cpu_s:.1f} s" in row and row.startswith("| spec-v2 | 0%; ")


def test_a_process_gone_or_another_group_gives_no_sample(server: subprocess.Popen[str]) -> None:
    assert host_sampling.sample(2**22 + 7) is None
    assert server.pid not in host_sampling.group(1)
    assert host_sampling.use_between({}, host_sampling.group(server.pid)) == ()


def test_tritons_cache_is_found_as_triton_finds_it(tmp_path: Path) -> None:
    assert host_sampling.triton_cache({"TRITON_CACHE_DIR": "/x/cache", "TRITON_HOME": "/y"}) == Path("/x/cache")
    assert host_sampling.triton_cache({"TRITON_HOME": "/y"}) == Path("/y/.triton/cache")
    assert host_sampling.triton_cache({}) == Path.home() / ".triton" / "cache"
    assert host_sampling.cache_entries(tmp_path / "none") is None
    (tmp_path / "k1").mkdir()
    (tmp_path / "stray-file").write_text("")
    assert host_sampling.cache_entries(tmp_path) == 1, "a kernel is a directory"


def test_a_level_that_met_a_new_shape_counts_its_compile_and_results_md_names_it(tmp_path: Path) -> None:
    cache = tmp_path / "triton"
    cache.mkdir()
    env = {"TRITON_CACHE_DIR": str(cache), "FAKE_COMPILE_AT_BS": "4"}
    r = run_fake_bench(tmp_path / "out", "--configs", "nospec", "--concurrency", "1,4", "--num-requests", "4", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    levels = json.loads((tmp_path / "out" / "results.json").read_text())["configs"]["nospec"]["levels"]
    assert [lv["triton_compiles"] for lv in levels] == [0, 1], "the warm-up met bs 4 with short requests only"
    md = (tmp_path / "out" / "results.md").read_text()
    assert "Triton kernels compiled during measured levels" in md and "`nospec` C=4: 1." in md
    (run, _) = read_results(tmp_path / "out" / "results.json")
    assert [lv.triton_compiles for lv in run.configs["nospec"].levels] == [0, 1], "read back as a field"
