"""`bench.bus`'s figures as a table for people (the JSON it writes holds them all)."""

from __future__ import annotations

from typing import Any


def print_table(result: dict[str, Any], baseline_consumer: bool) -> None:
    """The paths' rates, latencies and CPU, then the baseline's and the ratios when one ran."""
    print(f"{'path':<44}{'per second':>12}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/msg':>12}")
    print(f"{'raw JetStream publish':<44}{result['raw_publish_per_s']:>12.0f}")
    print(
        f"{'outbox -> relay -> consumer, flat out':<44}{result['e2e_per_s']:>12.0f}"
        f"{result['saturated_p50_ms']:>10.1f}{result['saturated_p99_ms']:>10.1f}"
        f"{result['e2e_cpu_us_per_msg']:>12.0f}"
    )
    paced_label = f"  same, paced at {result['latency_at_load']:.0%}"
    print(
        f"{paced_label:<44}{result['e2e_per_s'] * result['latency_at_load']:>12.0f}"
        f"{result['e2e_p50_ms']:>10.1f}{result['e2e_p99_ms']:>10.1f}"
    )
    print(
        f"{'  producers alone (one event per commit)':<44}{result['producers_per_s']:>12.0f}{'':>20}"
        f"{result['producers_cpu_us_per_msg']:>12.0f}"
    )
    print(
        f"{'  relay + consumer alone (committed backlog)':<44}{result['bus_per_s']:>12.0f}{'':>20}"
        f"{result['bus_cpu_us_per_msg']:>12.0f}"
    )
    print(f"ratio raw / e2e: {result['raw_publish_per_s'] / result['e2e_per_s']:.1f}x")
    if "baseline" in result:
        base = result["baseline"]
        what = base.get("consumer") or f"relay lingering {base.get('relay_linger_ms')} ms"
        if baseline_consumer:
            print(
                f"baseline ({what}): relay + consumer alone {base['bus_per_s']:.0f}/s at "
                f"{base['bus_cpu_us']:.0f} us/msg; after / before per repetition: "
                + ", ".join(f"{r:.2f}" for r in result["ratio_bus_per_s"])
                + " (rate), "
                + ", ".join(f"{r:.2f}" for r in result["ratio_bus_cpu_us"])
                + " (CPU per message)"
            )
        print(
            f"baseline ({what}): {base['e2e_per_s']:.0f}/s flat out, "
            f"p99 {base['e2e_p99_ms']:.1f} ms paced; after / before per repetition: "
            + ", ".join(f"{r:.2f}" for r in result["ratio_e2e_per_s"])
            + " (rate), "
            + ", ".join(f"{r:.2f}" for r in result["ratio_e2e_p99_ms"])
            + " (p99)"
        )
    print(
        f"relay rows per round: {result['relay_rows_per_round']:.1f} flat out, "
        f"{result['paced_relay_rows_per_round']:.1f} paced"
        + (
            f" (baseline {result['baseline']['relay_rows_per_round']:.1f}, "
            f"{result['baseline']['paced_relay_rows_per_round']:.1f})"
            if "baseline" in result
            else ""
        )
    )
    print(f"load average (1 min) at start and end: {result['load_average_1m']}")
