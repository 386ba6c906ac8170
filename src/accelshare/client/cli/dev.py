"""``accelshare dev ...``: a local cluster in one command, and the demo tour."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from accelshare.common import AllocationMode, BinarySize, CommonValueError

from .common import EXIT_USAGE, fail

dev_app = typer.Typer(help="A local cluster for development and demos.", no_args_is_help=True)


@dev_app.command("up")
def up_command(
    data_dir: Annotated[
        Path,
        typer.Option(
            "--data-dir", "-d", help="State of the cluster (kept between runs).", show_default=True
        ),
    ] = Path(".accelshare"),
    port: Annotated[
        int, typer.Option("--port", "-p", min=1, max=65535, help="The manager's port.")
    ] = 8081,
    apps_port: Annotated[
        int | None,
        typer.Option(
            "--apps-port",
            min=1,
            max=65535,
            help="Serve app pages on this port, an origin of their own ([apps] listen-addr)"
            " [default: on the console's origin].",
            show_default=False,
        ),
    ] = None,
    agents: Annotated[
        int, typer.Option("--agents", "-n", min=1, max=64, help="How many agents.")
    ] = 1,
    cpus: Annotated[
        int, typer.Option("--cpus", min=1, help="CPU cores each agent advertises.")
    ] = 8,
    mem: Annotated[str, typer.Option("--mem", help="Memory each agent advertises.")] = "16g",
    mock_config: Annotated[
        Path | None,
        typer.Option(
            "--mock-config",
            help="mock-accelerator.toml describing each agent's devices"
            " [default: configs/accelerator/two-fgpu.toml, 2 GPUs of 1.0 share]",
            show_default=False,
        ),
    ] = None,
    allocation_mode: Annotated[
        AllocationMode,
        typer.Option("--allocation-mode", help="Share GPUs (fractional) or hand them out whole."),
    ] = AllocationMode.FRACTIONAL,
    unit_mem: Annotated[
        str | None,
        typer.Option("--unit-mem", help="GPU memory of 1.0 share (>= 512m) [default: 2g]."),
    ] = None,
    unit_proc: Annotated[
        int | None,
        typer.Option("--unit-proc", min=2, help="GPU processors of 1.0 share [default: 8]."),
    ] = None,
    quantum: Annotated[
        str | None,
        typer.Option("--quantum", help="Smallest step of a share, 0 < q <= 1 [default: 0.1]."),
    ] = None,
    jupyter: Annotated[
        bool,
        typer.Option(
            "--jupyter/--no-jupyter",
            help="Build the jupyter:4 environment (JupyterLab and NumPy, from the package"
            " index) in the background once the cluster runs; a failed build only leaves"
            " it out.",
        ),
    ] = True,
    env_cache: Annotated[
        Path | None,
        typer.Option(
            "--env-cache",
            help="Folder for the environments built with pip (shared between data dirs)"
            " [default: DIR/envs].",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON line once the cluster runs (endpoint, files, pids) and one"
            " when it stops, instead of the banner (for scripts).",
        ),
    ] = False,
) -> None:
    """Run a manager and agents with mock GPUs on this machine, until Ctrl-C.

    Everything is local: SQLite, the embedded config store, the process runtime. The
    endpoint, the console URL and the CLI's keys (DIR/client.env, which also puts
    `accelshare` on PATH) are printed once the agents have registered. Ctrl-C or
    SIGTERM stop every process it started, the sessions' kernels included. Re-running
    on the same --data-dir keeps the database, users, keys and session history
    (sessions that were running are then TERMINATED, PENDING ones still wait); the
    accelerator options always follow the command line.
    """
    from accelshare.devcluster.cluster import ClusterStartError, resolve_mock_config
    from accelshare.devcluster.layout import DevClusterOptions, check_accelerator_options
    from accelshare.devcluster.up import run_dev_up

    try:
        mem_bytes = int(BinarySize.finite_from_str(mem))
    except CommonValueError:
        fail(f"--mem {mem!r}: expected a size such as 16g or 512m", code=EXIT_USAGE)
    if mem_bytes <= 0:
        fail(f"--mem {mem!r}: expected a size > 0", code=EXIT_USAGE)
    options = DevClusterOptions(
        data_dir=data_dir,
        port=port,
        apps_port=apps_port,
        agents=agents,
        cpus=cpus,
        mem_bytes=mem_bytes,
        mock_config=mock_config,
        allocation_mode=allocation_mode.value,
        unit_mem=unit_mem,
        unit_proc=unit_proc,
        quantum=quantum,
        jupyter=jupyter,
        env_cache=env_cache.resolve() if env_cache is not None else None,
    )
    # Bad arguments are refused here, before anything starts, with exit code 2.
    problem = check_accelerator_options(options)
    if problem is not None:
        fail(problem, code=EXIT_USAGE)
    try:
        resolve_mock_config(mock_config)
    except ClusterStartError as e:
        fail(str(e), code=EXIT_USAGE)
    raise typer.Exit(run_dev_up(options, as_json=as_json))


@dev_app.command("demo")
def demo_command(
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="The manager's port [default: a free one].")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print the checks as one JSON document ({"passed": N, "failed": [...],'
            ' "checks": [...]}); the tour\'s output goes to stderr.',
        ),
    ] = False,
) -> None:
    """Run the README tour on a throwaway cluster and check what it shows.

    Creates 0.2 and 1.2 fGPU sessions and reads the allocation map (0.60 / 0.80, CLI and
    GraphQL), fills the 2 fGPU with three 1-fGPU sessions (one PENDING because of
    cuda.shares, as `session why` explains) and destroys one (the PENDING one becomes
    RUNNING by itself). Exits 1 if a check fails.
    """
    from accelshare.devcluster.demo import run_demo

    raise typer.Exit(run_demo(port=port, as_json=as_json))
