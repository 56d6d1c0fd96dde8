"""constraints.txt: the versions both README commands install are those every committed baseline of the
suite's own venv was made with (vLLM's baselines come from its own venv, tools/install-vllm.sh)."""

from __future__ import annotations

import json

import pytest
from packaging.requirements import Requirement

from replaytests.inputs.options import REPO

PINNED = {(req := Requirement(line)).name.lower(): str(req.specifier).removeprefix("==")
          for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.startswith("#")}
BASELINES = sorted(path for path in (REPO / "fixtures" / "ledgers").glob("*/run.json")
                   if "software.vllm" not in json.loads(path.read_text(encoding="utf-8")).get("platform", {}))


def test_both_readme_commands_install_with_the_constraints():
    block = (REPO / "README.md").read_text(encoding="utf-8").split("```sh\n", 1)[1].split("```", 1)[0]
    commands = block.splitlines()
    assert len(commands) == 2 and all("-c constraints.txt" in c.split("&&")[0] for c in commands), commands


@pytest.mark.parametrize("run", BASELINES, ids=[path.parent.name for path in BASELINES])
@pytest.mark.parametrize("package", ["torch", "transformers"])
def test_committed_baselines_were_made_with_the_pinned_versions(run, package):
    made = json.loads(run.read_text(encoding="utf-8"))["platform"][f"software.{package}"]
    assert made.split("+")[0] == PINNED[package], (
        f"{run.parent.name} was made with {package} {made}, constraints.txt pins {PINNED[package]}")
