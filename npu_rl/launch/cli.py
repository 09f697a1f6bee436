"""``bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT [ENV_SCRIPT]``: the same command on every node.

internal/launch.sh has already set the defaults, sourced CANN's set_env.sh files and the ENV_SCRIPT;
this module resolves the topology, then plays the head (preflight, start Ray, wait for every NPU,
run the recipe, stop Ray, exit with the recipe's code) or a worker (wait for the head, join, stay
attached while the head lives).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from npu_rl import REPO_ROOT
from npu_rl.errors import LaunchError, NodeLost, NodesMissing, NpuRlError, StackMismatch, TopologyError
from npu_rl.features import known_env
from npu_rl.launch import cluster, stack
from npu_rl.launch.environ import derived_env, ray_auth, shown_env, sourced_files, summary_rows
from npu_rl.launch.topology import Topology, resolve_topology
from npu_rl.table import format_table

EXIT_CODES = """environment (set in ENV_SCRIPT or the shell; defaults make one node work):
  NNODES (1)  MASTER_ADDR (this node; required if NNODES>1)  MASTER_PORT (6379)
  NPUS_PER_NODE (ASCEND_RT_VISIBLE_DEVICES's length, else counted from /dev/davinci* or npu-smi, else 16)
  ASCEND_RT_VISIBLE_DEVICES / ASCEND_VISIBLE_DEVICES (checked: ids, ascending, count)
  SOCKET_IFNAME (the interface to MASTER_ADDR)
  NODE_WAIT_TIMEOUT (300 s, head)  WORKER_JOIN_TIMEOUT (600 s, worker)  LOG_DIR (<repo>/logs)
  NODE_REFUSAL_NOTICE (15 s, head: how long a rejected head tells waiting workers why)
  RAY_START_ARGS (extra `ray start` arguments)  RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH (token auth stays on)
  ASCEND_SET_ENV_FILES (CANN set_env.sh files sourced when present)

exit codes:
  N   the head exits with TRAIN_SCRIPT's exit code (0 on success); --dry-run: 0 when the preflight passes
  0   a worker whose head finished and went away
  2   usage error (missing script, TRAIN_SCRIPT and ENV_SCRIPT swapped; an ENV_SCRIPT with a syntax
      error, or one that fails, exits or trains: nothing was started)
  65  the preflight rejected the recipe, or the recipe stopped before its preflight ran (nothing was started);
      on a worker: its head's preflight rejected the job, and the head told it why
  69  a Ray node already runs here or the port is taken (its holder named), or the head is unreachable
  70  Ray failed to start or died
  75  not every node / NPU joined before NODE_WAIT_TIMEOUT, or a node left the cluster during the run
      (the head names it, stops the recipe and Ray)
  78  bad topology: NNODES, MASTER_ADDR, SOCKET_IFNAME, NPUS_PER_NODE, visible devices, Ray token; or a
      node's stack (sources.lock, patch series, npu_rl, recipe) differs from the head's (both named)
  130/143  interrupted (SIGINT/SIGTERM, also during the preflight); the recipe (or preflight) and Ray were stopped
"""

GUARD_DIR = REPO_ROOT / "npu_rl" / "launch" / "guard"  # sitecustomize: no main_ppo, no Ray while planning


class Interrupted(BaseException):
    """Raised in the main thread by SIGINT/SIGTERM/SIGHUP so that every ``finally`` cleans up."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.reported = False  # True once a line said what was stopped


class LostNode(Interrupted):
    """Raised in the main thread when the node watch (SIGUSR1 from ``npu_rl.launch watch``) saw a node leave."""

    def __init__(self, reason: str):
        super().__init__(signal.SIGTERM)  # what the recipe's process group gets
        self.reason = reason


class _Signals:
    """First signal raises :class:`Interrupted`; later ones are only noted, so cleanup is not cut short.

    SIGUSR1 is the node watch's: it raises :class:`LostNode` with the reason the watch wrote to
    ``lost_report``.
    """

    lost_report: Path | None = None

    def __init__(self, log):
        self.log = log
        self.got: int | None = None

    def __enter__(self):
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
        self.saved = {s: signal.signal(s, self._handle) for s in sigs}
        return self

    def _handle(self, signum, _frame):
        if self.got is None:
            self.got = signum
            if signum == signal.SIGUSR1:
                reason = "a node left the Ray cluster"
                if _Signals.lost_report is not None:
                    try:
                        reason = _Signals.lost_report.read_text().strip() or reason
                    except OSError:
                        pass
                raise LostNode(reason)
            raise Interrupted(signum)
        self.log(f"{signal.Signals(signum).name} again: still stopping the recipe and Ray")

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)
        return False


class Launcher:
    def __init__(self, train_script: Path, env_script: Path | None, env: Mapping[str, str], overrides=()):
        self.train = train_script
        self.overrides = list(overrides)
        self.env_script = env_script
        # A real run never inherits plan-mode or env-sourcing markers (run_verl would take them for plan mode).
        self.env = {k: v for k, v in env.items() if k not in ("NPU_RL_PLAN_MARK", "NPU_RL_SOURCING_ENV")}
        self.verbose = False
        self.preflight_ran = False
        self.run_dir: Path | None = None
        self._log_file = None
        self._early: list[str] = []

    # -- output ---------------------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        line = f"[npu-rl {time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self._log_file:
            self._log_file.write(line + "\n")
            self._log_file.flush()
        else:
            self._early.append(line)  # written to launcher.log once the run directory exists

    def open_run_dir(self, topo: Topology) -> Path:
        base = Path(self.env.get("LOG_DIR") or REPO_ROOT / "logs")
        name = time.strftime("%Y%m%d-%H%M%S") + "-" + self.train.stem + ("" if topo.is_head else f"-{topo.node_ip}")
        for i in range(100):
            run = base / (name if i == 0 else f"{name}.{i}")
            try:
                run.mkdir(parents=True)
                break
            except FileExistsError:
                continue
        else:
            raise LaunchError(f"cannot create a run directory under {base}")
        self.run_dir = run
        self._log_file = open(run / "launcher.log", "a")  # noqa: SIM115 - closed in close()
        self._log_file.write("".join(line + "\n" for line in self._early))
        self._log_file.flush()
        self.env["NPU_RL_RUN_DIR"] = str(run)  # run_verl points Hydra's output folder here
        # verl's file tracker (trainer.logger with "file"), which python -m npu_rl.report reads. Set
        # before `ray start`, so the TaskRunner inherits it on whichever node it runs: each node's
        # launcher points it at that node's own run directory.
        self.env.setdefault("VERL_FILE_LOGGER_PATH", str(run / "metrics.jsonl"))
        return run

    def close(self) -> None:
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    # -- setup ----------------------------------------------------------------------------------------
    def resolve(self, dry_run: bool = False) -> Topology:
        topo = resolve_topology(self.env, dry_run=dry_run)
        from npu_rl.cpu import cpu_platform_selected

        cpu_platform = cpu_platform_selected(self.env)
        if cpu_platform and topo.devices_found:
            # The CPU platform is for machines without NPUs (development, CI); never pick it here.
            raise TopologyError(
                "VERL_PLATFORM=cpu (a CPU env script such as recipes/qwen3-tiny/env_cpu.sh) on a node with NPUs "
                f"({topo.npus_source}): the CPU platform is for machines without NPUs. Here run an NPU recipe with "
                "its env script, e.g. recipes/qwen3-0.6b/grpo_gsm8k_smoke.sh recipes/qwen3-0.6b/env_1node.sh"
            )
        if not dry_run and not cpu_platform and not topo.devices_found and self.env.get("NPU_RL_ALLOW_NO_NPU") != "1":
            # verl would fall back to another device type and hang instead of failing.
            raise TopologyError(
                "this node has no NPU (no /dev/davinci<N>, no npu-smi): a real run cannot train here. Check a recipe "
                "with --dry-run; NPU_RL_ALLOW_NO_NPU=1 starts Ray anyway (testing the launcher on CPU)"
            )
        self.env.update(derived_env(topo, self.env))
        try:
            auth, notes = ray_auth(self.env, topo)
        except TopologyError as e:
            if not dry_run:
                raise
            auth, notes = {}, [f"the real run would stop here: {e}"]  # a laptop has no cluster token
        if dry_run and topo.is_head:  # what the head would refuse before starting Ray
            # read once: a node seen here may be gone a moment later (another job's, or a test's, stopping)
            if raylets := cluster.running_raylets():
                notes.append(f"the real run would stop here: a Ray node already runs here ({raylets[0]})")
            elif cluster.port_open(topo.node_ip, topo.master_port):
                notes.append(
                    f"the real run would stop here: {cluster.port_busy_message(topo.node_ip, topo.master_port)}"
                )
        self.env.update(auth)
        self.env.setdefault("NPU_RL_TRAIN_PYTHON", sys.executable)
        self.labels = stack.stack_labels(REPO_ROOT, self.train, self.env_script, self.overrides)
        self.env["NPU_RL_RECIPE"] = str(self.train)
        self.env["NPU_RL_ENV_SCRIPT"] = str(self.env_script or "")
        # The feature switches every node starts Ray with; the preflight compares the recipe's view.
        self.env["NPU_RL_NODE_FEATURE_ENV"] = json.dumps({k: self.env[k] for k in sorted(known_env()) if k in self.env})
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), self.env.get("PYTHONPATH")) if p)
        role = "head" if topo.is_head else "worker"
        self.log(
            f"{role} node {topo.node_ip} ({topo.ifname}); job: {topo.nnodes} node(s) x {topo.npus_per_node} NPU "
            f"({topo.npus_source}) = {topo.world_size} dies, head {topo.address}"
        )
        for line in self._node_plan(topo):
            self.log(line)
        files = sourced_files(self.env)
        self.log("sourced: " + (", ".join(files) if files else "no CANN set_env.sh found (CPU machine?)"))
        for n in (*topo.notes, *notes):
            self.log(f"note: {n}")
        return topo

    def _node_plan(self, topo: Topology) -> list[str]:
        """What this node will wait for, how long, and what the other nodes must run (a multi-node job)."""
        if topo.nnodes == 1:
            return []
        cmd = " ".join(
            shlex.quote(str(a))
            for a in (
                "bash",
                "ray_start_npu.sh",
                self.train,
                *([self.env_script] if self.env_script else []),
                *self.overrides,
            )
        )
        same = f"MASTER_ADDR={topo.master_addr} MASTER_PORT={topo.master_port} NNODES={topo.nnodes} {cmd}"
        if topo.is_head:
            return [
                f"multi-node: after Ray starts, this head waits up to NODE_WAIT_TIMEOUT="
                f"{_seconds(self.env, 'NODE_WAIT_TIMEOUT', 300):g}s for {topo.nnodes - 1} other node(s) with "
                f"{topo.npus_per_node} NPU each; on each of them run the same command: {same}",
                "multi-node: during the run a node that leaves the cluster stops it (exit 75, the node named); "
                "a node whose stack (sources.lock, patch series, npu_rl, recipe) differs from this one's "
                "cannot join",
            ]
        return [
            "multi-node: this worker waits up to WORKER_JOIN_TIMEOUT="
            f"{_seconds(self.env, 'WORKER_JOIN_TIMEOUT', 600):g}s "
            f"for the head {topo.address}, joins it, and stops once the head is gone for HEAD_LOST_GRACE="
            f"{_seconds(self.env, 'HEAD_LOST_GRACE', 30):g}s; the head runs the recipe ({same})",
        ]

    def env_table(self) -> str:
        """Every shown variable, ``NAME  value`` per line: the run's env.txt."""
        return format_table(("variable", "value"), shown_env(self.env))

    def print_env(self) -> None:
        """The summary: the topology and what the user set (ENV_SCRIPT, shell); --verbose: every variable."""
        rows, left_out = summary_rows(self.env, verbose=self.verbose)
        title = "environment" + (
            f" (set by ENV_SCRIPT or the shell, and the topology; --verbose shows {left_out} more)" if left_out else ""
        )
        print(f"{title}:\n{format_table(('variable', 'value', 'from'), rows)}", file=sys.stderr, flush=True)

    # -- subprocesses ---------------------------------------------------------------------------------
    def _tee(
        self, cmd: list[str], env: Mapping[str, str], log_path: Path | None, what: str = "", forward: int | None = None
    ) -> int:
        """Run ``cmd`` in its own session, copying its output to stdout and ``log_path``; return its code.

        On :class:`Interrupted` the signal (or ``forward``) goes to the whole group, SIGKILL after a grace
        period, and one line says what was stopped (``what``).
        """
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env), start_new_session=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            while chunk := os.read(fd, 65536):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                if log:
                    log.write(chunk)
                    log.flush()
            return proc.wait()
        except Interrupted as e:
            name = what or (Path(cmd[1]).name if cmd[0] == "bash" else cmd[-1])
            cause = e.reason if isinstance(e, LostNode) else signal.Signals(e.signum).name
            self.log(f"{cause}: stopping {name}")
            e.reported = True
            grace = 10.0 if forward else float(self.env.get("NPU_RL_STOP_GRACE", "60"))
            _stop_group(proc, forward or e.signum, grace=grace)
            raise
        finally:
            if proc.poll() is None:
                _stop_group(proc, signal.SIGTERM, grace=10)
            if log:
                log.close()

    def plan(self, log_path: Path | None) -> int:
        """Run the recipe in plan mode: ``run_verl`` runs the preflight instead of training.

        The preflight leaves a mark (:attr:`preflight_ran`); a recipe that exits 0 without reaching
        ``run_verl`` checked nothing and is refused (65), and one that fails before it is told apart
        from a rejection. Nothing in plan mode can train or start Ray: ``RAY_ADDRESS`` points nowhere,
        and the guard on ``PYTHONPATH`` (``npu_rl/launch/guard``) refuses main_ppo, ``ray start`` and a
        local ``ray.init()``. An interrupt stops the preflight's whole process group (SIGTERM: no
        traceback) and is raised on.
        """
        with tempfile.TemporaryDirectory(prefix="npu-rl-plan-") as tmp:
            mark = Path(tmp) / "preflight-ran"
            env = {
                **self.env,
                "NPU_RL_MODE": "plan",
                "NPU_RL_PLAN_MARK": str(mark),
                "NPU_RL_CLI_OVERRIDES": "\n".join(self.overrides),
                "RAY_ADDRESS": "plan-mode-starts-no-ray:1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(GUARD_DIR), self.env.get("PYTHONPATH")) if p),
            }
            cmd = ["bash", str(self.train), *self.overrides]
            rc = self._tee(cmd, env, log_path, what=f"the preflight of {self.train.name}", forward=signal.SIGTERM)
            self.preflight_ran = mark.exists()
            if rc == 0 and not self.preflight_ran:
                hint = ""
                if _only_sets_variables(self.train):
                    hint = (
                        f". {self.train.name} only sets variables: it looks like an ENV_SCRIPT; the train script "
                        "comes first: bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT ENV_SCRIPT"
                    )
                self.log(
                    f"{self.train.name} exited 0 in plan mode without reaching run_verl: nothing was checked. "
                    'A recipe sources internal/verl.sh and ends with run_verl "${ARGS[@]}" "$@"' + hint
                )
                return 65
            if rc != 0 and not self.preflight_ran:
                self.log(self._stopped_early(rc))
                return 65
            return rc

    def _stopped_early(self, rc: int) -> str:
        """Why a recipe failed before its preflight gave a verdict, as far as the file tells."""
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        msg = (
            f"{self.train} stopped ({how}) before the preflight gave a verdict (it did not reach run_verl, or the "
            "preflight itself failed): nothing was checked; its output is above"
        )
        outside = REPO_ROOT not in self.train.parents
        relative = [
            ln.strip()
            for ln in _code_lines(self.train)
            if "internal/verl.sh" in ln and "NPU_RL_ROOT" not in ln and "source" in ln
        ]
        if outside and relative:
            msg += (
                f". It is outside the repository ({REPO_ROOT}) and sources internal/verl.sh relative to its own "
                f"folder ({relative[0][:100]}), which does not exist there. Source it through the root the launcher "
                'exports instead: source "${NPU_RL_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../..}/internal/verl.sh" '
                f"(NPU_RL_ROOT={REPO_ROOT}), as the shipped recipes do"
            )
        return msg

    def ray_exe(self) -> str:
        local = Path(sys.executable).with_name("ray")
        exe = str(local) if local.exists() else shutil.which("ray")
        if not exe:
            raise LaunchError(f"no `ray` next to {sys.executable} or on PATH: install ray in the training environment")
        return exe

    # -- roles ----------------------------------------------------------------------------------------
    def head(self, topo: Topology, preflight: bool) -> int:
        run = self.run_dir
        assert run is not None
        # A Ray node (another launcher's) or a taken port is refused before the preflight's minutes,
        # and again just before `ray start` (something may have started meanwhile).
        cluster.refuse_foreign_cluster(topo.node_ip, topo.master_port)
        if preflight:
            self.log("preflight: checking the recipe before starting the cluster")
            rc = self.plan(run / "preflight.txt")
            if rc != 0:
                if self.preflight_ran:
                    self.log(f"the preflight rejected {self.train} (exit {rc}); the cluster was not started")
                else:
                    self.log("the cluster was not started")
                self._tell_workers(topo, run / "preflight.txt")
                return 65
        cluster.refuse_foreign_cluster(topo.node_ip, topo.master_port)
        args = cluster.ray_start_args(
            head=True, topo_address=topo.address, node_ip=topo.node_ip, port=topo.master_port,
            npus=topo.npus_per_node, extra=self.env.get("RAY_START_ARGS", ""), labels=self.labels,
        )  # fmt: skip
        cluster.ensure_head_token(self.ray_exe(), self.env, self.log)
        node = cluster.RayNodeProcess(self.ray_exe(), args, run / "ray-head.log", self.env)
        started = time.time()
        watch: subprocess.Popen | None = None
        with _Signals(self.log):
            try:
                self.log(f"starting the Ray head on {topo.address} ({topo.npus_per_node} NPU); log: {node.log_path}")
                node.start()
                self._wait_gcs(node, topo)
                self._wait_nodes(topo)
                watch = self._watch_nodes(topo)
                self.log(f"running {self.train}; log: {run / 'train.log'}")
                rc = self._tee(["bash", str(self.train), *self.overrides], self.env, run / "train.log")
                self.log(f"{self.train.name} exited with {rc}")
                return rc
            except LostNode as e:
                self.log(
                    f"error: {e.reason} during the run: the run was stopped (a collective would have waited "
                    f"HCCL_EXEC_TIMEOUT={self.env.get('HCCL_EXEC_TIMEOUT', '?')}s). Check that node (its launcher's "
                    "output, dmesg, the network), then start the job again on every node"
                )
                return NodeLost.exit_code
            except Interrupted as e:
                return 128 + e.signum
            finally:
                if watch is not None:
                    _stop_group(watch, signal.SIGTERM, grace=5)
                _Signals.lost_report = None
                self.log("stopping Ray")
                node.stop()
                self._forget_cluster(topo)
                self._sweep_shm(started)

    def _tell_workers(self, topo: Topology, preflight_log: Path) -> None:
        """After a rejection, tell the workers that wait for this head why, on its Ray port, for up to
        NODE_REFUSAL_NOTICE seconds or until every other node was told (they poll every 3 s)."""
        window = _seconds(self.env, "NODE_REFUSAL_NOTICE", 15)
        if topo.nnodes == 1 or window <= 0:
            return
        lines = preflight_log.read_text(errors="replace").splitlines() if preflight_log.is_file() else []
        errors = [ln.strip() for ln in lines if re.search(r"\berror\b", ln, re.IGNORECASE)]
        reason = "\n".join(f"  {ln[:300]}" for ln in (errors or lines[-10:])[:10])
        message = f"{reason}\n  (the head {topo.node_ip}: {preflight_log})"
        self.log(
            f"telling the other {topo.nnodes - 1} node(s) why on {topo.address}, for up to "
            f"NODE_REFUSAL_NOTICE={window:g}s (Ctrl-C stops now)"
        )
        try:
            told = cluster.serve_refusal(topo.node_ip, topo.master_port, message, topo.nnodes - 1, window)
        except OSError as e:
            reason = e.strerror or e
            self.log(f"could not tell the other nodes ({topo.address}: {reason}); they wait out WORKER_JOIN_TIMEOUT")
            return
        missing = topo.nnodes - 1 - len(told)
        self.log(
            f"told {len(told)} node(s) ({', '.join(told) or 'none'})"
            + (f"; {missing} did not ask within {window:g}s and wait out their WORKER_JOIN_TIMEOUT" if missing else "")
        )

    def _wait_nodes(self, topo: Topology) -> None:
        """The wait runs in a child process: a Ray driver installs its own SIGTERM handler, which would
        otherwise replace ours and let a SIGTERM kill the launcher without stopping Ray."""
        timeout = _seconds(self.env, "NODE_WAIT_TIMEOUT", 300)
        cmd = [sys.executable, "-m", "npu_rl.launch", "wait", f"--address={topo.address}"]
        cmd += [f"--nodes={topo.nnodes}", f"--npus-per-node={topo.npus_per_node}", f"--timeout={timeout:g}"]
        cmd += [f"--labels={json.dumps(self.labels)}"]
        rc = self._tee(cmd, self.env, self.run_dir / "launcher.log" if self.run_dir else None)
        if rc == NodesMissing.exit_code:
            raise NodesMissing(f"not every node joined within NODE_WAIT_TIMEOUT={timeout:g}s (see above)")
        if rc == StackMismatch.exit_code:
            raise StackMismatch("a node that joined runs another stack (see above); Ray was stopped")
        if rc:
            raise LaunchError(f"waiting for the nodes failed (exit {rc}); Ray's log: {self.run_dir}")

    def _watch_nodes(self, topo: Topology) -> subprocess.Popen | None:
        """Start the node watch of a multi-node job (``npu_rl.launch watch``, its own session): when a node
        leaves the cluster it writes why to the run directory and sends this launcher SIGUSR1."""
        if topo.nnodes == 1 or self.run_dir is None:
            return None
        report = self.run_dir / "lost-node.txt"
        _Signals.lost_report = report
        cmd = [sys.executable, "-m", "npu_rl.launch", "watch", f"--address={topo.address}", f"--parent={os.getpid()}"]
        cmd += [f"--report={report}", f"--interval={_seconds(self.env, 'NODE_WATCH_INTERVAL', 2)}"]
        with open(self.run_dir / "launcher.log", "ab") as log:
            return subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def _wait_gcs(self, node: cluster.RayNodeProcess, topo: Topology) -> None:
        deadline = time.monotonic() + _seconds(self.env, "RAY_START_TIMEOUT", 120)
        while not cluster.port_open(topo.node_ip, topo.master_port):
            if not node.alive():
                raise LaunchError(f"`ray start` exited with {node.proc.returncode}:\n{node.log_tail()}")
            if time.monotonic() > deadline:
                raise LaunchError(f"the Ray head did not open {topo.address} in time:\n{node.log_tail()}")
            time.sleep(0.5)

    def worker(self, topo: Topology) -> int:
        run = self.run_dir
        assert run is not None
        cluster.refuse_running_node()
        args = cluster.ray_start_args(
            head=False, topo_address=topo.address, node_ip=topo.node_ip, port=topo.master_port,
            npus=topo.npus_per_node, extra=self.env.get("RAY_START_ARGS", ""), labels=self.labels,
        )  # fmt: skip
        node = cluster.RayNodeProcess(self.ray_exe(), args, run / "ray-worker.log", self.env)
        lost_grace = _seconds(self.env, "HEAD_LOST_GRACE", 30)
        started = time.time()
        with _Signals(self.log):
            try:
                cluster.wait_for_head(
                    topo.master_addr, topo.master_port, _seconds(self.env, "WORKER_JOIN_TIMEOUT", 600), self.log
                )
                self._check_head_stack(topo)
                self.log(f"joining {topo.address} with {topo.npus_per_node} NPU; log: {node.log_path}")
                node.start()
                lost_since = None
                while True:
                    time.sleep(_seconds(self.env, "NPU_RL_WORKER_POLL", 5))
                    head_up = cluster.port_open(topo.master_addr, topo.master_port)
                    if not node.alive():
                        if not head_up:
                            self.log("the head went away; Ray on this node has stopped")
                            return 0
                        flag = cluster.head_only_flag(node.log_path)
                        if flag and flag in " ".join(node.cmd) and not flag.startswith("--port"):
                            # One RAY_START_ARGS for every node: Ray names the flag it takes on the head only.
                            self.log(
                                f"note: Ray refuses {flag} on a worker (a head-only flag of RAY_START_ARGS): "
                                "starting this node without it"
                            )
                            node = cluster.RayNodeProcess(
                                node.cmd[0], cluster.drop_flag(node.cmd[3:], flag), node.log_path, self.env
                            )
                            node.start()
                            continue
                        raise LaunchError(f"`ray start` exited with {node.proc.returncode}:\n{node.log_tail()}")
                    if head_up:
                        lost_since = None
                    elif lost_since is None:
                        lost_since = time.monotonic()
                    elif time.monotonic() - lost_since > lost_grace:
                        self.log(f"the head {topo.address} is gone (>{lost_grace:g}s); stopping Ray on this node")
                        return 0
            except Interrupted as e:
                return 128 + e.signum
            finally:
                node.stop()
                self._forget_cluster(topo)
                self._sweep_shm(started)

    def _check_head_stack(self, topo: Topology) -> None:
        """Refuse to join a head that runs another stack (in a child: Ray's GCS client, no driver here)."""
        cmd = [sys.executable, "-m", "npu_rl.launch", "check-head", f"--address={topo.address}"]
        cmd += [f"--labels={json.dumps(self.labels)}", f"--me=this node {topo.node_ip}"]
        rc = self._tee(cmd, self.env, self.run_dir / "launcher.log" if self.run_dir else None)
        if rc == StackMismatch.exit_code:
            raise StackMismatch("this node was not joined to the head (see above)")
        if rc:
            raise LaunchError(f"comparing this node's stack with the head's failed (exit {rc}; see above)")

    def _forget_cluster(self, topo: Topology) -> None:
        """After stopping this node's Ray: a plain ``ray.init()`` here must not go looking for the stopped cluster."""
        addresses = {topo.address, f"{topo.node_ip}:{topo.master_port}"}
        if not topo.is_head:
            try:
                addresses.add(f"{socket.gethostbyname(topo.master_addr)}:{topo.master_port}")
            except OSError:
                pass
        temp_dir = cluster.ray_temp_dir(self.env.get("RAY_START_ARGS", ""))
        if cluster.forget_cluster(sorted(addresses), temp_dir, self.log):
            self.log(
                f"removed Ray's current-cluster file ({temp_dir or 'the default temp dir'}), which named {topo.address}"
            )

    def _sweep_shm(self, started: float) -> None:
        """Remove the shared-memory segments the run's killed processes left (npu_rl.launch.shm)."""
        from npu_rl.launch import shm

        removed = shm.sweep(started)
        if removed:
            self.log(
                f"removed {len(removed)} shared-memory segment(s) the run's processes left in {shm.SHM_DIR} "
                f"({', '.join(p.name for p in removed[:3])}{' ...' if len(removed) > 3 else ''}; "
                "vLLM's message queues, not unlinked when Ray stops the engines)"
            )


def _stop_group(proc: subprocess.Popen, signum: int, grace: float) -> None:
    try:
        os.killpg(proc.pid, signum)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _code_lines(path: Path) -> list[str]:
    """The lines of a bash script that are not blank or comments."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _only_sets_variables(path: Path) -> bool:
    """True for a script whose every line is an assignment, export, set/shopt or source (an ENV_SCRIPT)."""
    lines = _code_lines(path)
    assignment = r"\s*((export|declare|readonly|local)(\s+-\w+)*\s+)?[A-Za-z_][A-Za-z0-9_]*(=.*)?"
    pattern = assignment + r"|\s*(set|shopt|source|\.|unset)\s.*"
    return bool(lines) and all(re.fullmatch(pattern, ln) for ln in lines)


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise LaunchError(f"{key}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise LaunchError(f"{key}={raw} must be > 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ray_start_npu.sh",
        usage="%(prog)s [-h] [--dry-run] [--no-preflight] [-v] TRAIN_SCRIPT [ENV_SCRIPT] [K=V ...]",
        description="Start or join the Ray cluster of one training job (the same command on every node); "
        "the head checks the recipe, waits for every NPU, runs TRAIN_SCRIPT and exits with its code.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="resolve topology and env, run the preflight; start nothing")
    p.add_argument("--no-preflight", action="store_true", help="head: skip the preflight (not recommended)")
    p.add_argument("-v", "--verbose", action="store_true", help="print every environment variable (with its origin)")
    p.add_argument(
        "train_script",
        type=Path,
        nargs="?",  # checked after parsing: argparse would call the optional ENV_SCRIPT "required" too
        metavar="TRAIN_SCRIPT",
        help="recipe: a bash script that ends with run_verl ...",
    )
    p.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="[ENV_SCRIPT] [OVERRIDE ...]",
        help="ENV_SCRIPT (a file, sourced before everything else) then Hydra overrides passed to the recipe",
    )
    return p


def _child_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The parser of a subcommand the launcher runs in a child process (``--address`` of the cluster)."""
    p = argparse.ArgumentParser(prog=f"python -m npu_rl.launch {name}", description=description)
    p.add_argument("--address", required=True)
    return p


def _child_log(msg: str) -> None:
    print(f"[npu-rl {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def build_wait_parser() -> argparse.ArgumentParser:
    p = _child_parser("wait", "Wait until a Ray cluster has its NPUs (the head's wait).")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--npus-per-node", type=int, required=True)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--labels", type=json.loads, default=None, help="the head's stack labels (JSON): refuse others")
    return p


def _main_watch(argv: list[str]) -> int:
    p = _child_parser("watch", "Tell the head's launcher (SIGUSR1) when a node leaves.")
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--report", type=Path, required=True)
    p.add_argument("--interval", type=float, default=2.0)
    a = p.parse_args(argv)

    def lost(msg: str) -> None:
        a.report.write_text(msg + "\n")
        _child_log(msg)
        os.kill(a.parent, signal.SIGUSR1)

    cluster.watch_nodes(a.address, lost, a.interval, stop=lambda: os.getppid() != a.parent)
    return 0


def _main_check_head(argv: list[str]) -> int:
    p = _child_parser("check-head", "Compare this node's stack with the head's.")
    p.add_argument("--labels", type=json.loads, required=True)
    p.add_argument("--me", default="this node")
    a = p.parse_args(argv)
    try:
        cluster.check_head_stack(a.address, a.labels, a.me)
    except NpuRlError as e:
        print(f"[npu-rl] error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def err(msg: str) -> None:
        print(f"[npu-rl] error: {msg}", file=sys.stderr, flush=True)

    if argv[:1] == ["watch"]:
        return _main_watch(argv[1:])
    if argv[:1] == ["check-head"]:
        return _main_check_head(argv[1:])
    if argv[:1] == ["wait"]:
        a = build_wait_parser().parse_args(argv[1:])
        try:
            cluster.wait_for_npus(
                a.address,
                a.nodes,
                a.npus_per_node,
                a.timeout,
                log=_child_log,
                labels=a.labels,
            )
        except NpuRlError as e:
            err(str(e))
            return e.exit_code
        return 0

    # Flags may come anywhere (users append --dry-run last); everything else after TRAIN_SCRIPT is
    # the ENV_SCRIPT and Hydra overrides, which never start with "-".
    flags = [a for a in argv if a in ("--dry-run", "--no-preflight", "-v", "--verbose", "-h", "--help")]
    unknown = [a for a in argv if a.startswith("-") and a not in flags]
    if unknown:
        err(f"unknown option {unknown[0]} (options: --dry-run, --no-preflight, --verbose, --help)")
        return 2
    parser = build_parser()
    args = parser.parse_args(flags + [a for a in argv if a not in flags])
    if args.train_script is None:
        parser.error(
            "give a TRAIN_SCRIPT (a recipe), then optionally its ENV_SCRIPT and Hydra overrides, e.g.: bash "
            "ray_start_npu.sh recipes/qwen3-tiny/grpo_learn_cpu.sh recipes/qwen3-tiny/env_cpu_learn.sh"
        )
    rest = list(args.rest)
    env_script = Path(rest.pop(0)) if rest and "=" not in rest[0] else None
    for script in (args.train_script, env_script):
        if script is not None and not script.is_file():
            err(
                f"{script} is not a file (usage: bash ray_start_npu.sh [--dry-run] TRAIN_SCRIPT [ENV_SCRIPT] [K=V ...])"
            )
            return 2
    launcher = Launcher(args.train_script.resolve(), env_script and env_script.resolve(), os.environ, rest)
    launcher.verbose = args.verbose
    try:
        with _Signals(launcher.log):
            return _run(launcher, args)
    except Interrupted as e:
        if not e.reported:
            launcher.log(f"{signal.Signals(e.signum).name}: stopped before anything was started")
        return 128 + e.signum
    except NpuRlError as e:
        launcher.log(f"error: {e}")
        return e.exit_code
    finally:
        launcher.close()


def _run(launcher: Launcher, args: argparse.Namespace) -> int:
    topo = launcher.resolve(dry_run=args.dry_run)
    if args.dry_run:
        # The plan first, then the environment it was made with.
        launcher.env["NPU_RL_DRY_RUN"] = "1"  # missing model/data files are warnings, not errors
        rc = launcher.plan(None)
        launcher.print_env()
        if launcher.preflight_ran:
            launcher.log(f"dry run: the preflight {'passed' if rc == 0 else 'rejected the recipe'} (exit {rc})")
        else:
            launcher.log(f"dry run: nothing was checked (exit {rc})")
        return rc
    run = launcher.open_run_dir(topo)
    (run / "env.txt").write_text(launcher.env_table() + "\n")
    launcher.print_env()
    launcher.log(f"every variable: {run / 'env.txt'}")
    if topo.is_head:
        return launcher.head(topo, preflight=not args.no_preflight)
    return launcher.worker(topo)
