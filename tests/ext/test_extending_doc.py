"""docs/extending.md runs as written: its files are written and its commands run, in order,
in an empty folder outside the repository, with the installed package only; the run
directories it makes describe their own data and methods."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "extending.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall(DOC.read_text(encoding="utf-8"))]


def test_the_page_has_every_kind_of_example():
    files = [b.splitlines()[0] for _, b in blocks() if b.startswith("# file:")]
    for name in ("mynets.py", "make_clients.py", "own_data.py", "mydata.py", "make_hf.py",
                 "mymethod.py", "mytrack.py"):
        assert f"# file: {name}" in files
    method = next(b for _, b in blocks() if b.startswith("# file: mymethod.py"))
    assert len(method.splitlines()) <= 60  # "a method in about 50 lines"
    assert "docs/extending.md" in (REPO / "README.md").read_text(encoding="utf-8")


@pytest.mark.timeout(900)
def test_every_example_runs_from_a_clean_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    assert not work.resolve().is_relative_to(REPO)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CLUSTERFL_DATA")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env["HF_DATASETS_CACHE"] = str(tmp_path / "hf_cache")  # nothing written to the home
    ran = 0
    for lang, body in blocks():
        first = body.splitlines()[0] if body else ""
        if first.startswith("# file:"):
            (work / first.split(":", 1)[1].strip()).write_text(body, encoding="utf-8")
        elif first.startswith("# not run"):
            if lang == "python":
                compile(body, "extending.md", "exec")
            elif lang == "toml":
                tomllib.loads(body)
        elif lang == "bash":
            for line in body.splitlines():
                if line.startswith("$ "):
                    done = subprocess.run(line[2:], shell=True, cwd=work, env=env,
                                          capture_output=True, text=True, timeout=600)
                    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                    ran += 1
        else:
            raise AssertionError(f"a {lang} block that is neither a file, a command nor "
                                 f"marked '# not run':\n{body[:200]}")
    assert ran >= 10

    def summary(run: str) -> dict:
        return json.loads((work / "runs" / run / "summary.json").read_text())

    def config(run: str) -> dict:
        return tomllib.loads((work / "runs" / run / "config.toml").read_text())

    own = summary("own_model")
    assert own["rounds"] == 5 and own["final"]["ari"] == 1.0  # continued to 5 rounds
    assert config("own_model")["model"] == {"name": "mynets:SmallCNN", "channels": 6}
    assert summary("clients")["federation"] == "npz:clients"
    assert summary("clients")["final"]["ari"] == 1.0
    assert config("clients")["data"]["source"] == "npz"
    assert summary("python")["federation"] == "opposite rules"
    assert config("python")["data"]["source"] == "python"
    assert summary("loader")["federation"] == "mirrored"
    assert config("loader")["data"] == {"source": "mydata:load", "n_clients": 6,
                                        "standardize": False}
    assert summary("hf")["federation"] == "hf:digits_hf/cluster_partitioner"
    table = [line for line in (work / "runs" / "compare" / "report.md").read_text().splitlines()
             if line.startswith("| ")]
    for label in ("FedAvg", "IFCA (K=2)", "k-means once (K=2)"):
        assert any(row.startswith(f"| {label} ") for row in table), label
    assert summary("compare/mymethod-KMeansOnce_n_clusters=2")["final"]["ari"] == 1.0
    assert list((work / "runs" / "board" / "tensorboard").glob("events.out.tfevents.*"))
    assert len((work / "track.jsonl").read_text().splitlines()) == 4
