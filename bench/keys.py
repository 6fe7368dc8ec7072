"""Tasks in order per key (issue 16): the throughput of keyed tasks against the same tasks without
keys, in the same run.

Variants, each a job of no-op tasks end to end (submit every task, close, take every outcome;
journal on), run by a real scheduler and one daemon of --slots slots on one local broker:

  no-keys    --keys × --per-key tasks without a key (the baseline)
  keys       the same tasks, --keys keys of --per-key tasks each, submitted round-robin
             (every key's first task, then every key's second, ...): a key's next task goes out
             once the outcome of its previous one was taken
  one-key    --hot tasks of one key: one round trip after another (its rate is 1 / round trip)

Variants are interleaved over --rounds rounds and the median kept; the ratio is to no-keys in
the same run. Each measurement also records the hypervisor's steal time (how noisy it was).

    python bench/keys.py [--keys 1000] [--per-key 20] [--hot 1000] [--rounds 3] [--slots 2]
                         [--json bench/results/keys.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from local import one_daemon_cluster
from report import Steal, write_json

from truba.client import Client
from truba.local.cluster import LocalCluster

HANDLER = "tests.handlers.basic:echo"


async def measure(cluster: LocalCluster, journal: Path, keys: int, per_key: int, *, keyed: bool) -> float:
    """Seconds for ``keys × per_key`` tasks end to end, with a key each (``keyed``) or none."""
    async with Client(cluster.address, journal=journal) as client:
        job = await client.create_job(HANDLER, name="bench-keys")
        began = time.perf_counter()
        for seq in range(per_key):
            for k in range(keys):
                if keyed:
                    await job.submit(seq, key=f"key-{k}")
                else:
                    await job.submit(seq)
        await job.close()
        count = 0
        async for outcome in job.results():
            assert outcome.ok, outcome
            count += 1
        elapsed = time.perf_counter() - began
    assert count == keys * per_key, count
    return elapsed


async def run(args: argparse.Namespace, cluster: LocalCluster, tmp: Path) -> dict[str, object]:
    variants = {
        "no-keys": (args.keys, args.per_key, False),
        "keys": (args.keys, args.per_key, True),
        "one-key": (1, args.hot, True),
    }
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    steal = Steal()
    for round_ in range(args.rounds):
        for name, (keys, per_key, keyed) in variants.items():
            if not keys * per_key:
                continue
            steal.lap()
            seconds = await measure(cluster, tmp / f"journal-{name}-{round_}", keys, per_key, keyed=keyed)
            sample = {"seconds": seconds, "tasks_per_s": keys * per_key / seconds, "steal": steal.lap()}
            samples[name].append(sample)
            print(
                f"round {round_} {name:<8} {seconds:7.2f} s  {sample['tasks_per_s']:8.0f} tasks/s  "
                f"steal {sample['steal']:.1%}",
                flush=True,
            )
    medians = {
        name: statistics.median(s["tasks_per_s"] for s in runs) for name, runs in samples.items() if runs
    }
    return {
        "keys": args.keys,
        "per_key": args.per_key,
        "hot": args.hot,
        "slots": args.slots,
        "rounds": args.rounds,
        "tasks_per_s": medians,
        "ratio_to_no_keys": {name: rate / medians["no-keys"] for name, rate in medians.items()},
        "samples": samples,
    }


def print_table(result: dict[str, object]) -> None:
    rates: dict[str, float] = result["tasks_per_s"]  # type: ignore[assignment]
    ratios: dict[str, float] = result["ratio_to_no_keys"]  # type: ignore[assignment]
    keys, per_key, hot = result["keys"], result["per_key"], result["hot"]
    tasks = {
        "no-keys": f"{keys} x {per_key}",
        "keys": f"{keys} keys x {per_key}",
        "one-key": f"1 key x {hot}",
    }
    slots, rounds = result["slots"], result["rounds"]
    print(f"\nno-op tasks end to end, one daemon of {slots} slots, median of {rounds} rounds")
    print(f"{'variant':<9}{'tasks':>18}{'tasks/s':>10}{'ratio':>8}")
    for name, rate in rates.items():
        print(f"{name:<9}{tasks[name]:>18}{rate:>10.0f}{ratios[name]:>8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--per-key", type=int, default=20)
    parser.add_argument("--hot", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path("bench/results/keys.json"))
    args = parser.parse_args()
    with one_daemon_cluster("truba-bench-keys-", args.slots) as bench:
        result = asyncio.run(run(args, bench.cluster, bench.tmp))
    print_table(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
