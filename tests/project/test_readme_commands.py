"""Every shell command of the README runs after ``make demo``, in a fresh clone (issue 17).

The commands are read from ``README.md``'s fenced ``sh``/``bash``/``console`` blocks (one
test case per command, its id the command), so a command added to the README is tested
without touching this file. They run, in the README's order (later ones read what earlier
ones wrote: ``cost ./reports`` after ``audit ... --out ./reports``; a case selected
alone runs the commands before it first), as separate
processes in a copy of the project's files in a folder with nothing beside it (no
``../shared``), after the demo ran there once, with the installed environment's ``bin/``
first on ``PATH`` and the clone's code first on ``PYTHONPATH``.

What the README's placeholders stand for is made real, never skipped:

- ``./archive`` is a generated fleet in the clone, ``./our-prices.toml`` a price file,
  ``./budgets.toml`` a budget file;
- ``s3://bucket/...`` is a bucket ``bucket`` on a local S3 endpoint (moto's server),
  reached through the standard AWS environment as the README says S3 is;
- :data:`PLACEHOLDERS` maps the rest (a scheduler address, a session id, an elided
  ledger path) to real values; ``[--opt value]`` (optional) is run with the option.

Commands that cannot run here are in :data:`NOT_RUN` with the reason; a test fails when
either table names something the README no longer has, so neither rots.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc
import pytest
import s3fs
from distributed import Client

from pipeline.io.commit import read_dataset
from pipeline.io.storage import resolve
from pipeline.synth.local_s3 import free_port, local_s3

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: Commands the README documents that this test does not run, with the reason.
NOT_RUN: dict[str, str] = {
    "make demo": "its recipe (`vakpipe demo`, read from the Makefile) runs once in the "
                 "clone before every case; creating .venv again would take minutes",
    "make test": "it is the suite this test is part of",
    "vakpipe export otel ./reports --endpoint http://127.0.0.1:4318 --header x-api-key=YOUR_KEY":
        "it needs an OTLP collector listening there; tests/integration/test_otel_export.py "
        "sends to a local receiver instead",
}

#: README placeholder -> what it stands for here (filled in by the ``world`` fixture).
PLACEHOLDER_NAMES: dict[str, str] = {
    "tcp://10.0.0.5:8786": "scheduler",   # a Dask scheduler of one's own
    "0199a1f2-5f00-7000-8000-00000000abcd": "session_id",  # a session of the archive
    "./archive/agents/vak/sessions/2d87…/0199….jsonl": "ledger",  # one with a t4/i2
}

#: Generated sessions in ``./archive`` (and in ``s3://bucket/archive``): a small fleet,
#: so each command is a few seconds.
SESSIONS = 40
S3_BUCKET = "bucket"
FENCE = re.compile(r"^```(sh|bash|console|shell)[ \t]*\n(.*?)^```", re.M | re.S)
#: What a command with ``--fail-on``/``--max-*`` may also return: the README's exit 1.
THRESHOLD_OPTIONS = ("--fail-on", "--max-changed", "--max-new-overflows")


def readme_commands(text: str) -> list[str]:
    """The shell commands of ``text``'s fenced shell blocks, in order.

    Line continuations are joined, comments dropped, a ``console`` block's prompt
    (``$ ``) removed and its output lines skipped; whitespace is collapsed.
    """
    commands: list[str] = []
    for lang, body in FENCE.findall(text):
        body = body.replace("\\\n", " ")
        for line in body.splitlines():
            if lang == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            words = shlex.split(line, comments=True)
            if words:
                # back to one string, as written (shlex.join would quote `[--full]`)
                commands.append(" ".join(words))
    return commands


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_the_tables_name_only_readme_commands() -> None:
    assert COMMANDS, "no shell commands found in README.md's fenced blocks"
    assert len(set(COMMANDS)) == len(COMMANDS), "a README command is documented twice"
    assert sorted(set(NOT_RUN) - set(COMMANDS)) == [], "NOT_RUN names a command gone"
    gone = [p for p in PLACEHOLDER_NAMES if not any(p in c for c in COMMANDS)]
    assert gone == [], "PLACEHOLDER_NAMES names a placeholder gone from the README"


def test_the_readme_parser() -> None:
    text = ("x\n```sh\nvakpipe a ./x   # note\nvakpipe b s3://y \\\n    --by day,agent\n```\n"
            "```python\nprint(1)\n```\n```console\n$ make demo\nlocal S3 endpoint: ...\n```\n")
    assert readme_commands(text) == ["vakpipe a ./x", "vakpipe b s3://y --by day,agent",
                                     "make demo"]


# --- the world the commands run in ---------------------------------------------------

def project_files() -> list[str]:
    """The files a clone has: git's tracked ones plus the untracked, not ignored ones
    (the coordinator commits later); without git, the tree minus venv and caches."""
    try:
        listed = [subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", *extra],
                                 capture_output=True, check=True, timeout=60).stdout
                  for extra in ((), ("--others", "--exclude-standard"))]
    except (OSError, subprocess.SubprocessError):
        skip = {".venv", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis",
                "out", "__pycache__", "vakpipe.egg-info"}
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                if not p.is_dir() and not skip & set(p.relative_to(REPO).parts)]
    return sorted({name for out in listed for name in out.decode().split("\0") if name})


def fresh_clone(dest: Path) -> None:
    for name in project_files():
        src = REPO / name
        if not src.exists() and not src.is_symlink():
            continue  # tracked, deleted in the working tree
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name, follow_symlinks=False)


def demo_recipe() -> list[str]:
    """The ``make demo`` recipe's command, ``$(BIN)/`` dropped (``vakpipe`` is on PATH)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^demo:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert match, "no demo target in the Makefile"
    last = match[1].strip().splitlines()[-1].strip()
    return shlex.split(last.replace("$(BIN)/", ""))


@dataclass(frozen=True)
class World:
    """A clone after ``make demo``, and what the README's placeholders stand for."""

    clone: Path
    env: dict[str, str]
    values: dict[str, str]
    #: The README commands run so far in the clone (a set the cases add to).
    ran: set[str] = field(default_factory=set)


def base_env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "DASK_SCHEDULER", "PYTHONPATH"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(clone)  # the clone's code, not the working tree's
    return env


def run(args: list[str], world_cwd: Path, env: dict[str, str],
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=world_cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("clone")
    clone = base / "vakpipe"
    fresh_clone(clone)
    assert sorted(p.name for p in base.iterdir()) == ["vakpipe"]  # nothing beside it
    env = base_env(clone)

    # `make demo`: its recipe, in the clone (the demo starts its own S3 endpoint).
    done = run(demo_recipe(), clone, env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (clone / "out" / "demo" / "audit" / "_SUCCESS").is_file()

    with local_s3(set_env=False) as server:
        env = {**env, **server.env()}
        s3fs.S3FileSystem(skip_instance_cache=True, key=server.env()["AWS_ACCESS_KEY_ID"],
                          secret=server.env()["AWS_SECRET_ACCESS_KEY"],
                          client_kwargs={"endpoint_url": server.endpoint}).mkdir(S3_BUCKET)
        for archive in ("./archive", f"s3://{S3_BUCKET}/archive"):
            done = run(["vakpipe", "generate", archive, "--sessions", str(SESSIONS),
                        "--seed", "1"], clone, env)
            assert done.returncode == 0, done.stderr
        (clone / "our-prices.toml").write_text(
            '# our contract\n[[model]]\nprovider = "anthropic"\npattern = "claude-sonnet-4-5*"\n'
            "input = 2.5\noutput = 12.0\ncache_read = 0.25\ncache_write = 3.0\n",
            encoding="utf-8")
        (clone / "budgets.toml").write_text(  # the README's budget file
            '[[budget]]\nperiod = "month"\nwarn = 50\nlimit = 100\n\n'
            '[[budget]]\nagent = "vak"\nperiod = "day"\nlimit = 20\n', encoding="utf-8")
        values = pick_session(tmp_path_factory.mktemp("readme-pick"), clone, env)
        # A scheduler of one's own: separate processes, as a deployment runs them, with
        # the endpoint's environment (its workers read the archive).
        port = free_port()
        address = f"tcp://127.0.0.1:{port}"
        scratch = tmp_path_factory.mktemp("readme-dask")  # not beside the clone
        bin_dir = Path(sys.executable).parent
        procs = [subprocess.Popen([str(bin_dir / "dask"), "scheduler", "--host", "127.0.0.1",
                                   "--port", str(port), "--dashboard-address", "127.0.0.1:0"],
                                  env=env, cwd=scratch, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)]
        procs.append(subprocess.Popen([str(bin_dir / "dask"), "worker", address, "--nworkers",
                                       "1", "--nthreads", "1", "--local-directory",
                                       str(scratch)],
                                      env=env, cwd=scratch, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        try:
            with Client(address, timeout=30,  # type: ignore[no-untyped-call]
                        set_as_default=False) as client:
                client.wait_for_workers(1, timeout=60)
            yield World(clone, env, {**values, "scheduler": address})
            with Client(address, timeout=30,  # type: ignore[no-untyped-call]
                        set_as_default=False) as client:
                client.shutdown()  # faster than a signal, and both exit cleanly
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def pick_session(out: Path, clone: Path, env: dict[str, str]) -> dict[str, str]:
    """A session of the archive for ``--session``, and a ledger with a request at
    ``t4/i2`` for ``show`` (found from a replay into ``out``, outside the clone)."""
    done = run(["vakpipe", "replay", "./archive", "--out", str(out), "--workers", "0",
                "--no-progress"], clone, env)
    assert done.returncode == 0, done.stderr
    requests = read_dataset(resolve(str(out)), "requests")
    paths = sorted(set(requests.filter(pc.equal(requests["scope"], "t4/i2"))
                       ["session_path"].to_pylist()))
    assert paths, "no generated session has a request at t4/i2"
    return {"ledger": f"./archive/{paths[0]}", "session_id": Path(paths[0]).stem}


def concrete(command: str, values: dict[str, str]) -> list[str]:
    """``command`` with its placeholders replaced and ``[optional]`` arguments kept."""
    for placeholder, name in PLACEHOLDER_NAMES.items():
        command = command.replace(placeholder, values[name])
    command = re.sub(r"\[([^\]]*)\]", r"\1", command)
    return shlex.split(command)


def expected_exits(command: str) -> set[int]:
    """0, and 1 where the command sets a threshold (README: exit 1 when it is crossed),
    4 where it checks budgets (README: exit 4 over a limit)."""
    words = command.split()
    return ({0, 1} if any(opt in words for opt in THRESHOLD_OPTIONS) else {0}) | (
        {4} if "--budgets" in words else set())


RUN = [c for c in COMMANDS if c not in NOT_RUN]


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN, ids=RUN)
def test_readme_command_runs_after_make_demo(command: str, world: World) -> None:
    # What the earlier commands write, this one may read (as a reader following the
    # README does): run those not run yet, so a case selected alone (-k) works too.
    for earlier in RUN[:RUN.index(command)]:
        if earlier not in world.ran:
            world.ran.add(earlier)
            run(concrete(earlier, world.values), world.clone, world.env)
    world.ran.add(command)
    done = run(concrete(command, world.values), world.clone, world.env)
    assert done.returncode in expected_exits(command), (
        f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr}")
    assert "Traceback" not in done.stderr, done.stderr
