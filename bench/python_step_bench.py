#!/usr/bin/env python3
"""Python batched decode step against the C++ RequestManager::Step, same trace, same run
(issue 13, performance: <= 100 us per Python step for 1,024 running requests).

The trace is store_bench's BM_SchedulerTrace: 1,024 requests with 2,048-token prompts in groups
of 16 sharing their first 1,024 tokens, 64-token blocks (DeepSeek-V3, fp8_ds_mla, an unbacked
pool: bookkeeping only); every request admitted and prefilled, then decode steps of one token per
request. Per repeat two identical managers are built; one is stepped from Python
(RequestManager.step: numpy arrays in, StepResult arrays out), the other by a C++ loop of
RequestManager::Step calls over the same batch, timed inside the module
(RequestManager._step_loop_ns). The order alternates between repeats. Reported: per-step median,
p99, mean and max of both, the Python overhead (median difference) and the ratio of medians.

    cmake --preset release && cmake --build build/release --target tessera_python
    PYTHONPATH=build/release/python /usr/bin/python3 bench/python_step_bench.py
"""

import argparse
import json
import sys
import time

import numpy as np

import tessera

REQUESTS, PROMPT, SHARED, GROUP = 1024, 2048, 1024, 16


def trace_prompts():
    r = np.arange(REQUESTS, dtype=np.uint64)[:, None]
    t = np.arange(PROMPT, dtype=np.uint64)[None, :]
    shared = (r // GROUP) * 100000 + t
    own = 50000000 + r * PROMPT + t
    return np.where(t < SHARED, shared, own).astype(np.uint32)


def build(prompts):
    m = tessera.RequestManager("deepseek-v3", kv_format="fp8_ds_mla", capacity_blocks=40000, max_requests=REQUESTS,
                               backed=False, hash_key_seed=7)
    ids = np.empty(REQUESTS, dtype=np.uint32)
    for i, p in enumerate(prompts):
        a = m.admit(p)
        m.append(a.request_id, p[a.cached_tokens:])
        ids[i] = a.request_id
    hits = m.metrics()["tessera_prefix_hits_total"]["samples"]['unit="tokens"']
    expected = (REQUESTS - REQUESTS // GROUP) * SHARED
    if hits != expected:
        sys.exit("unexpected prefix hits: %d (expected %d)" % (hits, expected))
    return m, ids


def summary(ns):
    ns = np.sort(np.asarray(ns, dtype=np.float64))
    return {
        "median_us": float(np.median(ns)) / 1e3,
        "p99_us": float(ns[min(len(ns) - 1, int(0.99 * len(ns)))]) / 1e3,
        "mean_us": float(ns.mean()) / 1e3,
        "max_us": float(ns[-1]) / 1e3,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=256, help="decode steps per repeat (default 256)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats, each with two fresh managers (default 5)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    prompts = trace_prompts()
    counts = np.ones(REQUESTS, dtype=np.uint32)
    tokens = np.full(REQUESTS, 7, dtype=np.uint32)
    py_ns, cpp_ns = [], []
    for rep in range(args.repeats):
        def run_python():
            m, ids = build(prompts)
            for _ in range(args.steps):
                t0 = time.perf_counter_ns()
                r = m.step(ids, counts, tokens)
                py_ns.append(time.perf_counter_ns() - t0)
                if r.failed:
                    sys.exit("a Python decode step failed")
            if m.tokens(int(ids[0])) != PROMPT + args.steps:
                sys.exit("the Python steps did not append")

        def run_cpp():
            m, ids = build(prompts)
            cpp_ns.extend(m._step_loop_ns(ids, counts, tokens, args.steps).tolist())
            if m.tokens(int(ids[0])) != PROMPT + args.steps:
                sys.exit("the C++ steps did not append")

        for run in ((run_python, run_cpp) if rep % 2 == 0 else (run_cpp, run_python)):
            run()

    py, cpp = summary(py_ns), summary(cpp_ns)
    out = {
        "trace": "%d requests, %d-token prompts, groups of %d sharing %d tokens, 64-token blocks, "
                 "%d decode steps x %d repeats" % (REQUESTS, PROMPT, GROUP, SHARED, args.steps, args.repeats),
        "python_step": py,
        "cpp_step": cpp,
        "python_overhead_us": py["median_us"] - cpp["median_us"],
        "python_over_cpp_median_ratio": py["median_us"] / cpp["median_us"],
        "target_python_median_us": 100.0,
        "within_target": py["median_us"] <= 100.0,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(out["trace"])
    for name, s in (("Python step", py), ("C++ Step", cpp)):
        print("%-12s median %8.2f us  p99 %8.2f us  mean %8.2f us  max %8.2f us" %
              (name, s["median_us"], s["p99_us"], s["mean_us"], s["max_us"]))
    print("Python overhead per step (median difference): %.2f us; Python/C++ median ratio: %.3f" %
          (out["python_overhead_us"], out["python_over_cpp_median_ratio"]))
    print("target: Python step median <= 100 us: %s" % ("met" if out["within_target"] else "NOT met"))


if __name__ == "__main__":
    main()
