"""Writes the scheduler traces under tests/data/engine_traces/ (format: docs/ENGINES.md).

    /usr/bin/python3 python/tests/make_kv_traces.py tests/data/engine_traces

Each trace is written as NAME.trace.json. The figures vLLM's own KVCacheManager gives for a trace
(NAME.vllm.json) were obtained outside this repository (provenance in each file); this script
neither needs nor loads vLLM.
"""
import json
import os
import random
import sys

FORMAT = "tessera-kv-trace/1"

# DeepSeek-V4 traces: the models (Tessera presets, data/models) and the usable blocks of each
# trace's pool (vLLM's blocks are shared by all KV-cache groups; sizes chosen so that each trace
# shows what its name says: pressure where the original had it, none where it had none).
V4_MODELS = ("deepseek-v4-flash", "deepseek-v4-pro")
V4_BLOCKS = {m: {"prefix-sharing": 1000, "eviction-pressure": 800, "lookahead-reset": 600, "mixed": 1000,
                 "mixed-no-caching": 1000, "window": 1400,
                 "preempt": 1200, "returns": 500, "edge": 2000} for m in V4_MODELS}


def trace(name, about, config, requests, steps):
    return {"format": FORMAT, "name": name, "about": about, "config": config,
            "requests": requests, "steps": steps}


def prefix_sharing():
    # 16-token blocks, 64 usable blocks: chunked prefill, hits on a prefix another request is
    # still prefilling, the prompt-1 cap (a prompt of whole blocks), identical prompts.
    reqs = {
        "a": {"prompt": [[1000, 100]], "out_seed": 1},
        "b": {"prompt": [[1000, 64], [5000, 40]], "out_seed": 2},
        "c": {"prompt": [[1000, 100]], "out_seed": 3},
        "d": {"prompt": [[1000, 96]], "out_seed": 4},
        "e": {"prompt": [[1000, 100], [7000, 30]], "out_seed": 5},
    }
    steps = [
        [{"run": "a", "chunk": 64}],
        [{"run": "a", "chunk": 64}, {"run": "b", "chunk": 512}],
        [{"run": "a"}, {"run": "b"}, {"run": "c", "chunk": 512}],
    ]
    for _ in range(14):
        steps.append([{"run": "a"}, {"run": "b"}, {"run": "c"}])
    steps.append([{"free": "a"}, {"run": "b"}, {"run": "c"}, {"run": "d", "chunk": 512}])
    steps.append([{"run": "b"}, {"run": "c"}, {"run": "d"}, {"run": "e", "chunk": 32}])
    for _ in range(4):
        steps.append([{"run": "b"}, {"run": "c"}, {"run": "d"}, {"run": "e", "chunk": 32}])
    steps.append([{"free": "b"}, {"free": "c"}, {"free": "d"}, {"free": "e"}])
    return trace("prefix-sharing", "chunked prefill, hits on a prefix still being prefilled, the "
                 "prompt-1 cap, identical prompts", {"block_size": 16, "num_gpu_blocks": 65,
                 "max_model_len": 4096, "enable_caching": True}, reqs, steps)


def eviction_pressure():
    # 12 usable blocks of 16 tokens: requests fill the pool, finish, and later prompts evict
    # cached blocks; earlier prompts come back to see which prefixes survived; one admission is
    # refused (the whole prompt does not fit) and one decode is preempted.
    reqs = {
        "a": {"prompt": [[100, 70]], "out_seed": 1},
        "b": {"prompt": [[300, 50]], "out_seed": 2},
        "c": {"prompt": [[500, 90]], "out_seed": 3},
        "a2": {"prompt": [[100, 70]], "out_seed": 4},
        "b2": {"prompt": [[300, 50]], "out_seed": 5},
        "big": {"prompt": [[900, 250]], "out_seed": 6},
        "d": {"prompt": [[100, 48], [2000, 60]], "out_seed": 7},
        "e": {"prompt": [[3000, 60]], "out_seed": 8},
    }
    steps = [
        [{"run": "a"}, {"run": "b"}],
        [{"run": "a"}, {"run": "b"}],
        [{"run": "a"}, {"run": "b"}],
        [{"free": "a"}, {"run": "b"}],
        [{"free": "b"}, {"run": "c"}],
        [{"run": "c"}, {"run": "big"}],
        [{"run": "c"}],
        [{"free": "c"}, {"run": "a2"}, {"run": "b2"}],
        [{"run": "a2"}, {"run": "b2"}],
        [{"free": "a2"}, {"free": "b2"}, {"run": "d", "chunk": 32}, {"run": "e"}],
    ]
    for _ in range(12):
        steps.append([{"run": "d", "chunk": 32}, {"run": "e"}])
    steps.append([{"free": "e"}, {"run": "d", "chunk": 32}])
    steps.append([{"free": "d"}, {"run": "big"}])
    return trace("eviction-pressure", "a small pool: eviction of cached blocks, a refused "
                 "admission, a preempted decode, prefixes coming back", {"block_size": 16,
                 "num_gpu_blocks": 13, "max_model_len": 4096, "enable_caching": True}, reqs, steps)


def lookahead_reset():
    # Lookahead slots (speculative decoding's drafts), reset_prefix_cache refused while blocks
    # are in use and honoured once all are free, then no hits.
    reqs = {
        "a": {"prompt": [[10, 40]], "out_seed": 1},
        "b": {"prompt": [[10, 32], [800, 9]], "out_seed": 2},
        "c": {"prompt": [[10, 40]], "out_seed": 3},
    }
    steps = [[{"run": "a", "lookahead": 0}], [{"run": "a", "lookahead": 3}, {"run": "b"}]]
    for _ in range(10):
        steps.append([{"run": "a", "lookahead": 3}, {"run": "b", "lookahead": 3}])
    steps.append([{"reset_prefix_cache": True}, {"free": "a"}])
    steps.append([{"free": "b"}, {"reset_prefix_cache": True}])
    steps.append([{"run": "c"}])
    steps.append([{"run": "c", "lookahead": 3}])
    steps.append([{"free": "c"}])
    return trace("lookahead-reset", "lookahead slots, reset_prefix_cache refused then honoured",
                 {"block_size": 16, "num_gpu_blocks": 41, "max_model_len": 4096,
                  "enable_caching": True}, reqs, steps)


def mixed(name, seed, caching, blocks):
    # Random arrivals from four prompt families (a shared system prompt of 1-6 blocks, then a
    # private tail), chunked prefill, decodes, finishes after a random number of steps.
    rng = random.Random(seed)
    families = [(10000 * (f + 1), 16 * rng.randint(1, 6)) for f in range(4)]
    reqs, live, steps = {}, [], []
    n = 0
    for s in range(80):
        step = []
        if s < 60 and rng.random() < 0.45:
            base, shared = families[rng.randrange(4)]
            rid = "r%d" % n
            tail = rng.randint(1, 70)
            reqs[rid] = {"prompt": [[base, shared], [100000 + 1000 * n, tail]], "out_seed": n}
            live.append([rid, rng.randint(3, 18)])
            n += 1
        for item in list(live):
            if item[1] == 0:
                step.append({"free": item[0]})
                live.remove(item)
            else:
                step.append({"run": item[0], "chunk": 48, "lookahead": rng.choice([0, 0, 2])})
                item[1] -= 1
        steps.append(step)
    steps.append([{"free": rid} for rid, _ in live])
    return trace(name, "seeded random mix (seed %d): four prompt families, chunked prefill, "
                 "decodes, lookahead, finishes" % seed, {"block_size": 16, "num_gpu_blocks": blocks + 1,
                 "max_model_len": 4096, "enable_caching": caching}, reqs, steps)


def v4(t, model, blocks, scale=16):
    """A trace of DeepSeek-V4 (several KV-cache groups: ADR 0028) from one of the traces above:
    every token count (prompt runs, chunks) times `scale`, so that its 16-token blocks become
    vLLM's 256-token blocks of V4's compressed (full-attention) group; lookahead unchanged."""
    name = "v4-%s-%s" % (model.split("-")[-1], t["name"])
    reqs = {rid: dict(r, prompt=[[first * scale, count * scale] for first, count in r["prompt"]])
            for rid, r in t["requests"].items()}
    steps = [[dict(op, chunk=op["chunk"] * scale) if "chunk" in op else dict(op) for op in step]
             for step in t["steps"]]
    config = dict(t["config"], model=model, block_size=t["config"]["block_size"] * scale,
                  max_model_len=t["config"]["max_model_len"] * scale, num_gpu_blocks=blocks + 1,
                  max_num_batched_tokens=8192)
    return trace(name, t["about"] + " (token counts x%d, DeepSeek-V4 groups)" % scale, config, reqs, steps)


def v4_window(model, blocks):
    # DeepSeek-V4's sliding-window groups (window 128 in 64-token blocks, compressor states in 4-
    # and 8-token blocks) beside its compressed group (256-token blocks): prompts far past the
    # window, whose window blocks are released while they prefill and are then evicted; prefixes
    # shared at and off the 256-token alignment; a prefix whose full-attention blocks survive but
    # whose window blocks do not; decodes across block boundaries; a refused admission.
    reqs = {
        "long": {"prompt": [[1, 3000]], "out_seed": 1},
        "same": {"prompt": [[1, 3000], [90000, 100]], "out_seed": 2},
        "mid": {"prompt": [[1, 1100], [91000, 500]], "out_seed": 3},
        "off": {"prompt": [[1, 1000], [92000, 37]], "out_seed": 4},
        "short": {"prompt": [[1, 200]], "out_seed": 5},
        "fill": {"prompt": [[200000, 2600]], "out_seed": 6},
        "fill2": {"prompt": [[300000, 2600]], "out_seed": 7},
        "back": {"prompt": [[1, 2900], [93000, 300]], "out_seed": 8},
        "huge": {"prompt": [[400000, 6000]], "out_seed": 9},
    }
    steps = [[{"run": "long", "chunk": 1024}], [{"run": "long", "chunk": 1024}]]
    steps.append([{"run": "long", "chunk": 1024}, {"run": "same", "chunk": 700}])
    for _ in range(6):
        steps.append([{"run": "long"}, {"run": "same", "chunk": 700}, {"run": "short"}])
    steps.append([{"free": "short"}, {"run": "long"}, {"run": "same"}, {"run": "mid", "chunk": 512},
                  {"run": "off", "chunk": 333}])
    for _ in range(5):
        steps.append([{"run": "long", "lookahead": 2}, {"run": "same"}, {"run": "mid", "chunk": 512},
                      {"run": "off", "chunk": 333}])
    steps.append([{"free": "long"}, {"free": "same"}, {"run": "mid"}, {"run": "off"}])
    steps.append([{"free": "mid"}, {"free": "off"}, {"run": "fill", "chunk": 1024}])
    for _ in range(3):
        steps.append([{"run": "fill", "chunk": 1024}, {"run": "fill2", "chunk": 1024}])
    steps.append([{"run": "fill"}, {"run": "fill2"}, {"run": "back", "chunk": 1024}])
    for _ in range(4):
        steps.append([{"run": "fill"}, {"run": "fill2"}, {"run": "back", "chunk": 1024}])
    steps.append([{"free": "fill"}, {"free": "fill2"}, {"run": "back"}, {"run": "huge", "chunk": 2048}])
    steps.append([{"run": "back"}, {"run": "long", "chunk": 2048}])
    for _ in range(3):
        steps.append([{"run": "back"}, {"run": "long", "chunk": 2048}])
    steps.append([{"free": "back"}, {"free": "long"}])
    steps.append([{"reset_prefix_cache": True}])
    return trace("v4-%s-window" % model.split("-")[-1], "DeepSeek-V4 groups: prompts past the window, "
                 "window blocks released while prefilling and evicted later, prefixes shared on and "
                 "off the 256-token alignment, a refused admission", {"model": model, "block_size": 256,
                 "num_gpu_blocks": blocks + 1, "max_model_len": 65536, "max_num_batched_tokens": 2048,
                 "enable_caching": True}, reqs, steps)


def v4_preempt(model, blocks):
    # DeepSeek-V4 without the whole-sequence admission check (full_sequence_must_fit false, as a
    # scheduler that admits on the first chunk): prompts admitted on a small first chunk run out
    # of blocks in their larger later chunks and are preempted, then admitted again with what
    # survived of their prefix.
    reqs = {rid: {"prompt": [[1, 1500], [10000 * (i + 1), 1500 + 300 * i]], "out_seed": i}
            for i, rid in enumerate(("p", "q", "r", "s"))}
    first = [{"run": rid, "chunk": 512} for rid in ("p", "q", "r", "s")]
    steps = [first]
    for _ in range(12):
        steps.append([{"run": rid, "chunk": 2048} for rid in ("p", "q", "r", "s")])
    steps.append([{"free": "p"}, {"free": "q"}, {"run": "r"}, {"run": "s"}])
    steps.append([{"free": "r"}, {"free": "s"}])
    return trace("v4-%s-preempt" % model.split("-")[-1], "DeepSeek-V4 groups, admission on the first "
                 "chunk only: preempted prefills, admitted again with the prefix that survived",
                 {"model": model, "block_size": 256, "num_gpu_blocks": blocks + 1, "max_model_len": 65536,
                  "max_num_batched_tokens": 8192, "enable_caching": True, "full_sequence_must_fit": False},
                 reqs, steps)


def v4_returns(model, seed, blocks):
    # DeepSeek-V4 groups, seeded: prompts from three families (a shared prefix of 1-4 blocks of
    # 256 tokens, then a private tail) that come back after they finish, so admissions hit
    # blocks that are cached and not in use (taking them removes them from the free queue, and
    # vLLM counts them against the free blocks), in a pool that is nearly full.
    rng = random.Random(seed)
    families = [(1000000 * (f + 1), 256 * rng.randint(1, 4)) for f in range(3)]
    reqs, live, steps, done = {}, [], [], []
    n = 0
    for s in range(60):
        step = []
        if s < 45 and rng.random() < 0.6:
            rid = "r%d" % n
            if done and rng.random() < 0.5:
                reqs[rid] = dict(reqs[rng.choice(done)], out_seed=n)  # a prompt seen before
            else:
                base, shared = families[rng.randrange(3)]
                tail = rng.randint(1, 600)
                reqs[rid] = {"prompt": [[base, shared], [5000000 + 10000 * n, tail]], "out_seed": n}
            live.append([rid, rng.randint(2, 8)])
            n += 1
        for item in list(live):
            if item[1] == 0:
                step.append({"free": item[0]})
                live.remove(item)
                done.append(item[0])
            else:
                step.append({"run": item[0], "chunk": rng.choice([256, 512, 1024])})
                item[1] -= 1
        steps.append(step)
    steps.append([{"free": rid} for rid, _ in live])
    return trace("v4-%s-returns" % model.split("-")[-1], "DeepSeek-V4 groups, seeded (seed %d): prompts "
                 "that come back after they finish, hitting cached blocks in a nearly full pool" % seed,
                 {"model": model, "block_size": 256, "num_gpu_blocks": blocks + 1, "max_model_len": 65536,
                  "max_num_batched_tokens": 2048, "enable_caching": True}, reqs, steps)


def v4_edge(model, blocks, filler):
    # DeepSeek-V4 groups at the edge of the pool: a prompt whose first 4096 tokens were computed
    # by a request that finished hits them (blocks cached, not in use), while another request
    # fills the pool so that the free blocks would cover its new blocks but not also the cached
    # blocks the hit takes off the free queue: vLLM refuses it (those count), then admits it
    # once the filler is gone.
    reqs = {"a": {"prompt": [[7000000, 4097]], "out_seed": 1}, "b": {"prompt": [[8000000, filler]], "out_seed": 2},
            "a2": {"prompt": [[7000000, 4096], [9000000, 8000]], "out_seed": 3}}
    steps = [[{"run": "a", "chunk": 8192}], [{"run": "a"}], [{"free": "a"}, {"run": "b", "chunk": 8192}],
             [{"run": "a2", "chunk": 1}], [{"free": "b"}, {"run": "a2", "chunk": 1}]]
    for _ in range(4):
        steps.append([{"run": "a2", "chunk": 2048}])
    steps.append([{"free": "a2"}])
    return trace("v4-%s-edge" % model.split("-")[-1], "DeepSeek-V4 groups: an admission refused only because "
                 "the cached blocks it hits count against the free blocks", {"model": model, "block_size": 256,
                 "num_gpu_blocks": blocks + 1, "max_model_len": 65536, "max_num_batched_tokens": 2048,
                 "enable_caching": True}, reqs, steps)


def main():
    out = sys.argv[1]
    traces = [prefix_sharing(), eviction_pressure(), lookahead_reset(), mixed("mixed", 7, True, 40),
              mixed("mixed-no-caching", 7, False, 40)]
    for model in V4_MODELS:
        traces += [v4(t, model, V4_BLOCKS[model][t["name"]]) for t in traces[:5]]
        traces.append(v4_window(model, V4_BLOCKS[model]["window"]))
        traces.append(v4_preempt(model, V4_BLOCKS[model]["preempt"]))
        traces.append(v4_returns(model, 1, V4_BLOCKS[model]["returns"]))
        traces.append(v4_edge(model, V4_BLOCKS[model]["edge"], 4740))
    for t in traces:
        with open(os.path.join(out, t["name"] + ".trace.json"), "w") as f:
            json.dump(t, f, indent=1, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
