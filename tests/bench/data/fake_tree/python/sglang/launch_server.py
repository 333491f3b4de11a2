"""Fake `python -m sglang.launch_server`: /health, /generate, /metrics, /flush_cache, /freeze_gc, /start_profile.

Generates `max_new_tokens` ids after a short sleep (streamed a token every 2 ms with "stream": true); counts spec/fallback steps by concurrency when
--speculative-disable-batch-size is given; logs spec-switch lines like the patch and a decode line
per request (and its text, with FAKE_LOG_PROMPTS=1); /start_profile writes a small rank-0 trace
(FAKE_TRACE) into the output_dir it is given.
"""

import argparse
import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int)
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--speculative-algorithm")
ap.add_argument("--speculative-disable-batch-size", type=int)
args, _ = ap.parse_known_args()
lock = threading.Lock()
state = {"inflight": 0, "spec": 0, "fallback": 0, "switches": 0, "on": True}
# A 10 ms window; two 2 ms kernels overlapping by 1 ms keep the GPU busy 3 ms of it: idle 0.7.
FAKE_TRACE = {
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::index", "ts": 0, "dur": 4000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 1000, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "decode_attention", "ts": 4000, "dur": 2000, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5000, "dur": 2000, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "cpu_op", "name": "aten::index", "ts": 9000, "dur": 1000, "pid": 1, "tid": 1},
    ]
}

# With stacks asked for (with_stack): the Python frames around the host's CUDA calls, as Kineto
# writes them ("path(line): function", on the thread that made the calls).
FRAME = "/tmp/tree/python/sglang/srt/{}"
STACK_EVENTS = [
    {
        "ph": "X",
        "cat": "python_function",
        "name": FRAME.format("managers/scheduler.py(10): run_batch"),
        "ts": 0,
        "dur": 9000,
        "pid": 1,
        "tid": 1,
    },
    {
        "ph": "X",
        "cat": "python_function",
        "name": FRAME.format("speculative/eagle_worker_v2.py(474): _draft_extend_for_prefill"),
        "ts": 1000,
        "dur": 2000,
        "pid": 1,
        "tid": 1,
    },
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 500, "dur": 10, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1500, "dur": 10, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 2500, "dur": 20, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 5000, "dur": 1000, "pid": 1, "tid": 1},
]


def write_trace(out_dir, with_stack):
    time.sleep(0.3)
    os.makedirs(out_dir, exist_ok=True)
    trace = {"traceEvents": FAKE_TRACE["traceEvents"] + (STACK_EVENTS if with_stack else [])}
    with gzip.open(os.path.join(out_dir, f"{time.time()}-TP-0.trace.json.gz"), "wt") as f:
        json.dump(trace, f)


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, n):
        """SGLang's streamed /generate: a chunk per token (cumulative text), then [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0 and no length: the reply ends when the connection closes
        for k in range(1, n + 1):
            time.sleep(0.002)
            chunk = {"text": "x" * k, "meta_info": {"completion_tokens": k}}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        with lock:
            state["inflight"] -= 1
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self):
        if self.path == "/health":
            return self._send(200, "{}")
        if self.path == "/metrics":
            m = (
                "".join(
                    f'sglang:spec_switch_{k}_total{{tp_rank="0"}} {float(state[k.split("_")[0]])}\n'
                    for k in ("spec_steps", "fallback_steps", "switches")
                )
                if args.speculative_disable_batch_size is not None
                else ""
            )
            return self._send(200, "# fake\n" + m, "text/plain")
        self._send(404, "{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/flush_cache":
            return self._send(200, "{}")
        if self.path == "/freeze_gc":
            if os.environ.get("FAKE_NO_FREEZE_GC"):
                return self._send(404, '{"detail": "Not Found"}')
            print("[fake TP0] freeze_gc: garbage collector frozen", flush=True)
            return self._send(200, "{}")
        if self.path == "/start_profile":
            threading.Thread(target=write_trace, args=(body["output_dir"], body.get("with_stack")), daemon=True).start()
            return self._send(200, "Start profiling.", "text/plain")
        n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
        if os.environ.get("FAKE_LOG_PROMPTS"):
            print(f"[fake TP0] request text: {body.get('text', '')[:40]!r}", flush=True)
        with lock:
            state["inflight"] += 1
            bs = state["inflight"]
            n_thr = args.speculative_disable_batch_size
            if n_thr is not None:
                on = bs <= n_thr
                if on != state["on"]:
                    state["switches"] += 1
                    state["on"] = on
                    print(f"[fake TP0] spec-switch: speculation {'ON' if on else 'OFF'} at bs={bs}", flush=True)
                state["spec" if on else "fallback"] += 1
            compile_at = os.environ.get("FAKE_COMPILE_AT_BS")
            # As Triton does for a shape first met: a kernel compiled into its cache. The warm-up's
            # requests (8 tokens) do not meet it.
            if compile_at and bs == int(compile_at) and n > 8 and not state.get("compiled"):
                state["compiled"] = True
                os.makedirs(os.path.join(os.environ["TRITON_CACHE_DIR"], f"kernel-{bs}"))
            print(
                f"[fake TP0] Decode batch, #running-req: {bs}, cuda graph: True, "
                f"gen throughput (token/s): 100.00, #queue-req: 0",
                flush=True,
            )
        if body.get("stream"):
            return self._stream(n)
        time.sleep(0.002 * n)
        with lock:
            state["inflight"] -= 1
        self._send(
            200, json.dumps({"text": "x" * n, "output_ids": list(range(n)), "meta_info": {"completion_tokens": n}})
        )


print(f"[fake TP0] fake server on {args.port}, argv {sys.argv[1:]}", flush=True)
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer((args.host, args.port), H).serve_forever()
