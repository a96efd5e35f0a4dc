"""Print the markdown tables of RESULTS.md from results_adversary.json / results_privacy.json."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent


def fmt(v: object, pct: bool = False) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{100 * v:.1f}" if pct else f"{v:.2f}"
    return str(v)


def adversary() -> None:
    res = json.loads((HERE / "results_adversary.json").read_text())
    print("| method | attack | benign acc (%) | all acc (%) | ARI benign vs truth | "
          "attackers isolated | benign sharing a cluster with an attacker | "
          "ARI benign/attacker | clusters | rejected |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, r in res.items():
        m, a = key.split("/")
        print(f"| {m} | {a} | {fmt(r['benign_accuracy'], True)} | {fmt(r['accuracy'], True)} | "
              f"{fmt(r['ari_benign'])} | {fmt(r['isolated'])} | {fmt(r['benign_exposed'])} | "
              f"{fmt(r['ari_adversarial'])} | {r['n_clusters']} | {fmt(r['rejected'])} |")


def privacy() -> None:
    from run import METHODS_B, PRIVACY

    raw = json.loads((HERE / "results_privacy.json").read_text())
    res = {f"{m}/{p}": raw[f"{m}/{p}"] for m in METHODS_B for p in PRIVACY
           if f"{m}/{p}" in raw}
    print("| method | setting | σ | ε (δ=1e-5) | accuracy (%) | ARI | clipped replies | "
          "wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for key, r in res.items():
        m, a = key.split("/")
        p = r["privacy"] or {}
        eps = p.get("epsilon")
        print(f"| {m} | {a} | {fmt(p.get('noise_multiplier'))} | "
              f"{'–' if eps is None else f'{eps:.3g}'} | {fmt(r['accuracy'], True)} | "
              f"{fmt(r['ari'])} | {fmt(r['clipped'])} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    adversary()
    print()
    privacy()
