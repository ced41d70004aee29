"""``fullshard plan SCRIPT:FACTORY``: the memory planner from the command line (docs/fsdp/plan.md).

fullshard plan train.py:make_model --devices 8 --nodes 2 --device-memory 80GiB --precision bf16-mixed --batch 4

``FACTORY`` is a function in ``SCRIPT`` (a ``.py`` file, or an importable module) that returns
``(module, example_batch)``; ``--batch N`` and ``--arg NAME=VALUE`` are passed to it as keyword
arguments (values read as Python literals). It should build the module cheaply: inside
``configure_model`` or on the meta device, as the planner never needs its weights.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from fullshard.errors import MisconfigurationError


def load_factory(spec: str) -> Any:
    """The callable ``SCRIPT:FACTORY`` names.

    Raises:
        MisconfigurationError: the spec is malformed, the script or the function is missing.
    """
    script, sep, name = spec.rpartition(":")
    if not sep or not script or not name.isidentifier():
        raise MisconfigurationError(
            f"{spec!r} is not SCRIPT:FACTORY. Write the script (a .py file or a module name), a colon, and the "
            "function returning (module, example_batch), such as train.py:make_model."
        )
    if script.endswith(".py"):
        path = Path(script)
        if not path.is_file():
            raise MisconfigurationError(f"script {script!r} does not exist. Give the path of a .py file.")
        sys.path.insert(0, str(path.resolve().parent))
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(script)
        except ModuleNotFoundError as error:
            raise MisconfigurationError(
                f"module {script!r} cannot be imported ({error}). Give a .py file or an importable module."
            ) from error
    factory = getattr(module, name, None)
    if not callable(factory):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise MisconfigurationError(
            f"{script} has no function {name!r}. Its functions and classes: {', '.join(found) or 'none'}."
        )
    return factory


def _factory_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for item in args.arg or []:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise MisconfigurationError(f"--arg {item!r} is not NAME=VALUE (such as --arg seq=2048).")
        try:
            kwargs[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kwargs[key] = text  # a bare word: a string
    if args.batch is not None:
        kwargs["batch"] = args.batch
    return kwargs


def run_plan(args: argparse.Namespace) -> int:
    """``fullshard plan``: print the table; exit 0 when a configuration fits, 2 when none does."""
    from fullshard.planner import plan

    factory = load_factory(args.factory)
    made = factory(**_factory_kwargs(args))
    if not (isinstance(made, tuple) and len(made) == 2):
        raise MisconfigurationError(
            f"{args.factory} returned {type(made).__name__}; it must return (module, example_batch)."
        )
    module, batch = made
    result = plan(
        module,
        batch,
        devices=args.devices,
        num_nodes=args.nodes,
        device_memory=args.device_memory,
        device_type=args.device_type,
        precision=args.precision,
        headroom=args.headroom,
        engines=tuple(args.engine) if args.engine else ("fsdp2", "fsdp"),
        wrap=tuple(args.wrap) if args.wrap else None,
        workers=args.workers,
        host_memory=args.host_memory,
    )
    print(result.table())
    if result.choice is not None:
        kwargs = result.choice.candidate.strategy_kwargs()
        name = "FSDP2Strategy" if result.choice.candidate.engine == "fsdp2" else "FSDPStrategy"
        print(f"\nchoice: {name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
    return 0 if result.choice is not None else 2


def add_plan_parser(groups: Any) -> None:
    """Add ``plan`` to the ``fullshard`` command's subcommands."""
    p = groups.add_parser(
        "plan", help="predict per-process peak memory of each FSDP configuration; choose one"
    )
    p.add_argument("factory", help="SCRIPT:FACTORY, a function returning (module, example_batch)")
    p.add_argument("--devices", type=int, required=True, help="processes per node")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument(
        "--device-memory", help="bytes per process, such as 80GiB (default: this CUDA device's free memory)"
    )
    p.add_argument(
        "--host-memory",
        help="host memory of one node, such as 1TiB: CPU-offload rows must fit it (default: not checked)",
    )
    p.add_argument("--device-type", choices=("cuda", "cpu"), help="default: cuda when available, else cpu")
    p.add_argument("--precision", default="32-true", help="the Trainer's precision string (default 32-true)")
    p.add_argument(
        "--headroom",
        type=float,
        default=0.05,
        help="fraction of device memory kept free above each process peak (default 0.05)",
    )
    p.add_argument(
        "--engine", action="append", choices=("fsdp2", "fsdp"), help="weigh only this engine (repeatable)"
    )
    p.add_argument(
        "--wrap", action="append", help="a block class name to wrap (repeatable; default: repeated blocks)"
    )
    p.add_argument("--workers", type=int, help="processes to simulate in (default: one per usable core)")
    p.add_argument("--batch", type=int, help="passed to the factory as batch=N")
    p.add_argument("--arg", action="append", help="NAME=VALUE passed to the factory (repeatable)")
    p.set_defaults(run=run_plan)
