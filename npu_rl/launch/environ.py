"""The environment every node of a job runs with, and how it is shown (secrets never)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from npu_rl.errors import TopologyError
from npu_rl.launch.topology import Topology

# Variables shown in the one summary the launcher prints (and writes to the run's env.txt).
SHOWN_PREFIXES = (
    "NNODES",
    "MASTER_",
    "NPUS_PER_NODE",
    "SOCKET_IFNAME",
    "HCCL_",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "RAY_",
    "ASCEND_",
    "PYTORCH_NPU_ALLOC_CONF",
    "TASK_QUEUE_ENABLE",
    "CPU_AFFINITY_CONF",
    "VLLM_",
    "NPU_RL_",
    "ALL_TO_ALL_RESHARD",
    "USE_ALLTOALL_OVERLAP",
    "ROLLOUT_REBALANCE_ENABLE",
    "NODE_WAIT_TIMEOUT",
    "WORKER_JOIN_TIMEOUT",
)
# Words of a variable's name (split at "_", any case) that say its value is a secret...
_SECRET_WORDS = frozenset({"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
# ... "KEY" after one of these, or as the last word (WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, HF_KEY) ...
_KEY_AFTER = frozenset({"API", "ACCESS", "PRIVATE", "SECRET", "AUTH", "SIGNING", "ENCRYPTION"})
# ... unless the name ends in a word that says the value is where the secret lives (a path is not secret).
_LOCATION_WORDS = frozenset({"PATH", "FILE", "DIR"})


def is_secret(key: str) -> bool:
    """True for variables whose value must never be printed or written to a log: a word of the name
    (split at ``_``) is or ends in a secret word (``HF_TOKEN``, ``RAY_AUTH_TOKEN``, ``PGPASSWORD``), or
    ``KEY`` follows ``API``/``ACCESS``/... or ends the name (``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``).
    Words that only contain one are not (``VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS``, ``TOKENIZERS_PARALLELISM``,
    ``MAX_TOKENS``), nor are names that end in ``PATH``/``FILE``/``DIR`` (``RAY_AUTH_TOKEN_PATH``: where
    the token is, which the launcher's messages name)."""
    words = [w for w in key.upper().split("_") if w]
    if not words or words[-1] in _LOCATION_WORDS:
        return False
    if any(w.endswith(s) for w in words for s in _SECRET_WORDS):  # PGPASSWORD, GITHUB_APITOKEN
        return True
    return any(w == "KEY" and (i == len(words) - 1 or words[i - 1] in _KEY_AFTER) for i, w in enumerate(words) if i)


def derived_env(topo: Topology, env: Mapping[str, str]) -> dict[str, str]:
    """Variables the launcher sets from the topology; values already in ``env`` win for the socket names.

    The topology keys themselves are always written back normalised, so the recipe and the
    preflight see exactly what the launcher resolved.
    """
    out = {
        "NNODES": str(topo.nnodes),
        "MASTER_ADDR": topo.master_addr,
        "MASTER_PORT": str(topo.master_port),
        "NPUS_PER_NODE": str(topo.npus_per_node),
        "SOCKET_IFNAME": topo.ifname,
        "NPU_RL_NODE_IP": topo.node_ip,
        "RAY_ADDRESS": topo.address,
    }
    for key in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        out[key] = env.get(key) or topo.ifname
    return out


def ray_auth(env: Mapping[str, str], topo: Topology) -> tuple[dict[str, str], list[str]]:
    """Ray token authentication for this node: (variables to set, notes to print).

    Token auth stays on (``RAY_AUTH_MODE=token``) unless the user sets ``RAY_AUTH_MODE=disabled``.
    The token comes from ``RAY_AUTH_TOKEN`` (never printed), ``RAY_AUTH_TOKEN_PATH``, or Ray's default
    ``~/.ray/auth_token``; a token file must be readable by its owner only.

    Raises:
        TopologyError: a token file is missing or readable by others, or a worker has no token.
    """
    notes: list[str] = []
    mode = (env.get("RAY_AUTH_MODE") or "token").lower()
    if mode == "disabled":
        if topo.nnodes > 1:
            notes.append(
                "RAY_AUTH_MODE=disabled: anyone who can reach "
                f"{topo.address} can run code as you; keep token authentication on for real clusters"
            )
        return {"RAY_AUTH_MODE": "disabled"}, notes
    if mode != "token":
        raise TopologyError(f"RAY_AUTH_MODE={env.get('RAY_AUTH_MODE')!r}: use 'token' (default) or 'disabled'")
    if env.get("RAY_AUTH_TOKEN"):
        return {"RAY_AUTH_MODE": "token"}, notes
    explicit = env.get("RAY_AUTH_TOKEN_PATH", "")
    path = Path(explicit).expanduser() if explicit else Path(env.get("HOME", str(Path.home()))) / ".ray" / "auth_token"
    if path.is_file():
        mode_bits = stat.S_IMODE(path.stat().st_mode)
        if mode_bits & 0o077:
            raise TopologyError(
                f"Ray token file {path} has mode {mode_bits:o}: others can read it; run `chmod 600 {path}`"
            )
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}, notes
    if explicit:
        raise TopologyError(f"RAY_AUTH_TOKEN_PATH={explicit} does not exist: point it at the head's token file")
    if not topo.is_head:
        raise TopologyError(
            "this worker has no Ray auth token: the head keeps it in ~/.ray/auth_token; with a shared home "
            "it is found there, otherwise copy it (mode 600) and set RAY_AUTH_TOKEN_PATH, or set RAY_AUTH_TOKEN"
        )
    if topo.nnodes > 1:
        notes.append(
            f"the head creates this cluster's Ray token in {path}; workers need the same token (shared home, "
            "or RAY_AUTH_TOKEN_PATH to a mode-600 copy)"
        )
    return {"RAY_AUTH_MODE": "token"}, notes


def shown_env(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key, value) pairs of the summary, sorted, with secrets replaced by ``<set, hidden>``."""
    rows = []
    for key in sorted(env):
        if not env[key] or key.startswith("NPU_RL_FROM_"):  # internal/launch.sh's bookkeeping
            continue
        if key.startswith(SHOWN_PREFIXES) or is_secret(key) and key.startswith(("RAY_", "NPU_RL_")):
            rows.append((key, "<set, hidden>" if is_secret(key) else env[key]))
    return rows


# Always in the short summary: what a node runs with, whoever set it.
ALWAYS_SHOWN = (
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NPUS_PER_NODE",
    "SOCKET_IFNAME",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "RAY_AUTH_MODE",
)
# Names internal/launch.sh records while it builds the environment (space-separated).
ORIGIN_KEYS = (("NPU_RL_FROM_ENV_SCRIPT", "ENV_SCRIPT"), ("NPU_RL_FROM_SHELL", "shell"), ("NPU_RL_FROM_CANN", "CANN"))
ORIGIN_DEFAULTS = "NPU_RL_FROM_DEFAULTS"


def origin(key: str, env: Mapping[str, str]) -> str:
    """Who set ``key``: ENV_SCRIPT, shell, CANN (set_env.sh), default (internal/launch.sh) or launcher."""
    for record, name in ORIGIN_KEYS:
        if key in env.get(record, "").split():
            return name
    return "default" if key in env.get(ORIGIN_DEFAULTS, "").split() else "launcher"


def summary_rows(env: Mapping[str, str], verbose: bool = False) -> tuple[list[tuple[str, str, str]], int]:
    """(variable, value, origin) rows of the printed summary, and how many shown rows were left out.

    The short form keeps :data:`ALWAYS_SHOWN` and what the user set (ENV_SCRIPT, shell), minus
    install paths (``ASCEND_*=/...``, CANN's own); ``verbose`` keeps every row of :func:`shown_env`.
    """
    rows = [(k, v, origin(k, env)) for k, v in shown_env(env)]
    if verbose:
        return rows, 0
    short = [
        r
        for r in rows
        if r[0] in ALWAYS_SHOWN
        or r[2] in ("ENV_SCRIPT", "shell")
        and not (r[0].startswith("ASCEND_") and r[1].startswith("/"))
    ]
    return short, len(rows) - len(short)


def sourced_files(env: Mapping[str, str]) -> list[str]:
    """The CANN set_env.sh files internal/launch.sh sourced (it records them in NPU_RL_SOURCED)."""
    return [p for p in env.get("NPU_RL_SOURCED", "").split(os.pathsep) if p]
