"""The Dockerfile, read statically (no Docker engine on CI), and run_container.sh with a stand-in docker."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
from pathlib import Path, PurePosixPath

from npu_rl import REPO_ROOT

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    parts = PurePosixPath(path).parts
    for pat in patterns:
        pat = pat.rstrip("/")
        if pat.startswith("**/"):
            if any(fnmatch.fnmatch(p, pat[3:]) for p in parts):
                return True
        elif fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(parts[0], pat):
            return True
    return False


def check_dockerfile(dockerfile: Path) -> tuple[list[str], int]:
    """(problems, scripts checked): COPY sources that are missing or .dockerignore'd, RUN scripts
    (and ``python -m npu_rl``) used before the layer that copies them."""
    ignore = [
        ln.strip() for ln in (REPO_ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and ln[0] != "#"
    ]
    problems, workdir, copied, checked = [], PurePosixPath("/"), set(), 0
    for word, args in instructions(dockerfile.read_text()):
        if word == "WORKDIR":
            workdir = workdir / args
        elif word == "COPY":
            *sources, dest = [t for t in shlex.split(args) if not t.startswith("--")]
            for src in sources:
                path = REPO_ROOT / src
                if not path.exists():
                    problems.append(f"COPY {src}: not in the repository")
                    continue
                if ignored(src.rstrip("/"), ignore):
                    problems.append(f"COPY {src}: excluded by .dockerignore")
                target = PurePosixPath(dest) if dest.startswith("/") else workdir / dest
                if path.is_dir():
                    copied.update(str(target / f.relative_to(path)) for f in path.rglob("*") if f.is_file())
                else:
                    copied.add(str(target / path.name) if dest.endswith("/") or len(sources) > 1 else str(target))
        elif word == "RUN":
            for script in re.findall(r"(?:bash|source|\./)\s*([\w./-]+\.sh)", args):
                if script.startswith("/usr/local/Ascend"):  # CANN's own, part of the base image
                    continue
                checked += 1
                if str(workdir / script) not in copied:
                    problems.append(f"RUN calls {script}, not copied in an earlier layer")
            for module in re.findall(r"-m (npu_rl[\w.]*)", args):
                if str(workdir / "npu_rl" / "__init__.py") not in copied:
                    problems.append(f"RUN uses {module} before npu_rl/ is copied")
    return problems, checked


def test_every_copy_source_exists_and_every_run_script_was_copied_before():
    steps = instructions(DOCKERFILE.read_text())
    assert steps[0][0] == "ARG" and any(w == "FROM" for w, _ in steps)
    problems, checked = check_dockerfile(DOCKERFILE)
    assert problems == []
    assert checked >= 4  # download, apply (twice), install


def test_static_check_catches_what_it_must(tmp_path):
    text = DOCKERFILE.read_text()
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace("RUN bash download_sources.sh", "RUN bash tools/run_tests.sh", 1))
    assert "RUN calls tools/run_tests.sh, not copied in an earlier layer" in check_dockerfile(broken)[0]
    broken.write_text(text.replace("COPY patches/ patches/", "COPY patchez/ patches/", 1))
    assert "COPY patchez/: not in the repository" in check_dockerfile(broken)[0]
    (REPO_ROOT / "logs").mkdir(exist_ok=True)  # git-ignored; the launcher creates it too
    broken.write_text(text.replace("COPY README.md ./", "COPY logs/ logs/", 1))
    assert "COPY logs/: excluded by .dockerignore" in check_dockerfile(broken)[0]


def test_run_container_mounts_the_devices_it_finds(tmp_path):
    dev, host, bin_ = tmp_path / "dev", tmp_path / "host", tmp_path / "bin"
    for d in (dev, host / "usr/local/Ascend/driver", bin_):
        d.mkdir(parents=True)
    for name in ("davinci0", "davinci3", "davinci_manager", "hisi_hdc"):
        (dev / name).touch()
    (bin_ / "docker").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (bin_ / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "NPU_RL_DEV_ROOT": str(dev)}
    env.update(NPU_RL_HOST_ROOT=str(host), HOME=str(tmp_path), USER="u", LOG_DIR=str(tmp_path / "logs"))
    env["DOCKER_ARGS"] = "-e EXTRA=1"
    r = subprocess.run(
        ["bash", str(REPO_ROOT / "docker" / "run_container.sh"), "--", "nproc"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    args = r.stdout.splitlines()
    devices = [args[i + 1] for i, a in enumerate(args) if a == "--device"]
    assert devices == [
        f"{dev}/davinci0:/dev/davinci0",
        f"{dev}/davinci3:/dev/davinci3",
        f"{dev}/davinci_manager:/dev/davinci_manager",
        f"{dev}/hisi_hdc:/dev/hisi_hdc",
    ]
    assert f"{host}/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro" in args
    assert args[-2:] == ["npu-rl-recipes:a3", "nproc"] and "2 NPU die(s)" in r.stderr
    assert "-it" not in args and "EXTRA=1" in args  # no terminal here: -i only; DOCKER_ARGS appended
    assert f"{tmp_path / 'logs'}:/opt/npu-rl-recipes/logs" in args
    bad = subprocess.run(
        ["bash", str(REPO_ROOT / "docker" / "run_container.sh"), "--image"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--image needs a value" in bad.stderr
    (dev / "davinci0").unlink()
    (dev / "davinci3").unlink()
    r = subprocess.run(
        ["bash", str(REPO_ROOT / "docker" / "run_container.sh")], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1 and "no " in r.stderr and "davinci<N> device on this host" in r.stderr
