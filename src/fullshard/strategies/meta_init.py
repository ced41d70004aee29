"""Exact fast initialisation: parameters built on the meta device, materialised one unit at a time.

[Note: exact meta-device initialisation]
``empty_init=True`` must give the model the eager constructor would have given, only without
ever holding it whole. Three things go wrong with a plain ``with torch.device("meta")``, and
each has its answer here:

- **Buffers** computed in ``__init__`` (a rotary embedding's ``inv_freq``) would be shapes
  without values, and nothing can recompute them. :func:`parameters_on_meta` moves only
  *parameters* to the meta device as they are registered; buffers are built for real (they are
  small), so they hold what the constructor computed.
- **Tied parameters** (input and output embeddings sharing one ``nn.Parameter``) would each get
  their own tensor from a per-module ``to_empty``. :class:`MetaInit` allocates each meta
  parameter once and puts the same new ``nn.Parameter`` into every module that shared it.
- **The model's own init** (Hugging Face's ``_init_weights``, std 0.02) would be skipped in
  favour of each layer's ``reset_parameters``. :class:`MetaInit` runs, for the modules of a
  unit, the same steps as eager construction: every module's ``reset_parameters()``
  (children before parents, as constructors run), then the nearest ancestor's HF-style
  ``_init_weights(module)`` over the unit (as ``post_init`` applies it), then the user's
  :meth:`fullshard.Module.init_weights` override. A later step overrides what an earlier one
  wrote.

Every allocated floating-point tensor is filled with NaN first; a parameter or buffer still
holding NaN after the three steps was initialised by nobody, and the error names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from fullshard.errors import MisconfigurationError

InitHook = Callable[[nn.Module], None]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within this context every parameter a module registers is moved to the meta device.

    Buffers, and tensors a constructor computes before registering them, stay real. A layer's
    own initialisation after registration (``reset_parameters()`` at the end of ``nn.Linear``'s
    constructor) then runs on meta tensors and costs nothing. The parameter keeps its class,
    ``requires_grad`` and attributes.
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and getattr(param, "_is_hf_initialized", False) and not param.is_meta:
            # Hugging Face marks the weights from_pretrained() loaded: moving them to the meta
            # device would drop them, and the model's init would then skip (NaN) or replace them
            raise MisconfigurationError(
                f"configure_model() loaded pretrained weights ({type(module).__name__}.{name}, e.g. with "
                "from_pretrained()) under empty_init=True, which builds parameters on the meta device and "
                "initialises them afresh: the loaded values would be lost. Use empty_init=False to start "
                "from pretrained weights, or build the model from its config (from_config) and load the "
                "weights with fit(ckpt_path=...)."
            )
        register(module, name, param)
        if param is not None and not param.is_meta:
            meta = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(param.__dict__)
            module._parameters[name] = meta

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _reset_of(module: nn.Module) -> Callable[[], None] | None:
    # torch's nn.MultiheadAttention only has the private _reset_parameters
    reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
    return reset if callable(reset) else None


def _owns_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)])


class MetaInit:
    """FSDP's ``param_init_fn``: materialise a unit's meta tensors on ``device`` and initialise
    them as in [Note: exact meta-device initialisation].

    FSDP calls it for every module of a unit (breadth-first, parents first) just before it
    shards that unit. The first call of a unit materialises the whole unit (its subtree, down to
    nested units, which are materialised already), so that the init steps can run in eager
    order; the later calls find nothing on the meta device and return.

    Args:
        device: where the tensors are allocated.
        root: the model being wrapped; names in errors are relative to it. None for layers wrapped
            by hand inside ``configure_model`` (the model around them does not exist yet).
        user_init: the user's ``Module.init_weights`` when overridden, called per module last.
    """

    def __init__(
        self, device: torch.device, root: nn.Module | None, user_init: InitHook | None = None
    ) -> None:
        self.device = device
        self.user_init = user_init
        self.names = {m: n for n, m in root.named_modules(remove_duplicate=False)} if root is not None else {}
        self.ancestors = _ancestors(root) if root is not None else {}
        # a meta parameter shared by several modules gets one real tensor: meta -> real
        self._allocated: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}

    def __call__(self, module: nn.Module) -> None:
        unit = _unit_modules(module)
        pending = [m for m in unit if _owns_meta(m)]
        if not pending:
            return
        for m in pending:
            self._allocate(m)
        self._initialise(unit, pending)
        self._check(pending)
        # Tied parameters are kept in one unit (see [Note: tied parameters stay in one unit]), so
        # nothing later shares these; letting go of them lets the unit's full tensors be freed
        # as soon as it is sharded.
        self._allocated.clear()

    # ------------------------------------------------------------------------------ steps
    def _allocate(self, module: nn.Module) -> None:
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            known = self._allocated.get(id(param))
            if known is None:
                real = torch.empty_like(param, device=self.device)
                if real.is_floating_point() or real.is_complex():
                    real.fill_(float("nan"))
                new = type(param)(real, requires_grad=param.requires_grad)
                new.__dict__.update(param.__dict__)
                self._allocated[id(param)] = (param, new)
            else:
                new = known[1]
            module._parameters[name] = new
        for name, buffer in list(module._buffers.items()):
            if buffer is None or not buffer.is_meta:
                continue
            if not (buffer.is_floating_point() or buffer.is_complex()):
                raise MisconfigurationError(
                    f"The buffer {self._qualified(module, name)} ({buffer.dtype}) is on the meta device, so its "
                    "values are lost and cannot be checked after initialisation. Build the model in "
                    "configure_model() without your own torch.device('meta') context: under "
                    "FSDPStrategy(empty_init=True) fullshard puts only parameters on the meta device."
                )
            module._buffers[name] = torch.full_like(buffer, float("nan"), device=self.device)

    def _initialise(self, unit: list[nn.Module], pending: list[nn.Module]) -> None:
        touched = set(pending)
        # modules whose subtree in this unit had meta tensors: their init may cover children
        order = [m for m in children_first(unit) if any(d in touched for d in _subtree(m, unit))]
        with torch.no_grad():
            for m in order:  # 1. as the constructors did, children first
                reset = _reset_of(m)
                if reset is not None:
                    reset()
            for m in order:  # 2. a Hugging Face model's _init_weights, as post_init applies it
                hook = _model_init(m, self.ancestors)
                if hook is not None:
                    hook(m)
            if self.user_init is not None:  # 3. the user's Module.init_weights
                for m in order:
                    self.user_init(m)

    def _check(self, pending: list[nn.Module]) -> None:
        missing = []
        for m in pending:
            for name, t in [*m._parameters.items(), *m._buffers.items()]:
                if t is not None and (t.is_floating_point() or t.is_complex()) and _has_nan(t):
                    missing.append(f"{self._qualified(m, name)} ({type(m).__name__})")
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise MisconfigurationError(
                f"FSDPStrategy(empty_init=True) built the model on the meta device, and nothing initialised "
                f"{shown}. Give the module a reset_parameters(), give the model an HF-style _init_weights(module), "
                "or override init_weights(module) on your fullshard.Module to set them; or use "
                "FSDPStrategy(empty_init=False)."
            )

    def _qualified(self, module: nn.Module, name: str) -> str:
        prefix = self.names.get(module, "")
        return f"{prefix}.{name}" if prefix else name


def _model_init(module: nn.Module, ancestors: dict[nn.Module, list[nn.Module]]) -> InitHook | None:
    """The HF-style ``_init_weights`` of ``module`` or of its nearest ancestor that has one."""
    for owner in [module, *ancestors.get(module, [])]:
        hook = getattr(owner, "_init_weights", None)
        if callable(hook):
            return hook  # type: ignore[no-any-return]
    return None


def _has_nan(tensor: torch.Tensor, chunk: int = 1 << 20) -> bool:
    """Whether ``tensor`` holds a NaN, checked a chunk at a time (``isnan()`` of a whole
    embedding would allocate a mask as large as the embedding itself)."""
    flat = tensor.detach().reshape(-1)
    return any(bool(part.isnan().any()) for part in flat.split(chunk))


def _ancestors(root: nn.Module) -> dict[nn.Module, list[nn.Module]]:
    """Each module's ancestors, nearest first (the first path to it, for modules reached twice)."""
    result: dict[nn.Module, list[nn.Module]] = {}

    def visit(module: nn.Module, chain: list[nn.Module]) -> None:
        if module in result:
            return
        result[module] = chain
        for child in module.children():
            visit(child, [module, *chain])

    visit(root, [])
    return result


def _is_fsdp(module: nn.Module) -> bool:
    """Whether ``module`` is an FSDP unit, of FSDP1 (a wrapper) or FSDP2 (``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    return isinstance(module, FullyShardedDataParallel | FSDPModule)


def _unit_modules(module: nn.Module) -> list[nn.Module]:
    """``module`` and its descendants, stopping at nested FSDP units (sharded already)."""
    found: list[nn.Module] = []
    seen: set[nn.Module] = set()
    stack = [module]
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        found.append(m)
        stack.extend(c for c in reversed(list(m.children())) if not _is_fsdp(c))
    return found


def _subtree(module: nn.Module, unit: list[nn.Module]) -> Iterator[nn.Module]:
    members = set(unit)
    stack = [module]
    while stack:
        m = stack.pop()
        yield m
        stack.extend(c for c in m.children() if c in members)


def children_first(unit: list[nn.Module]) -> list[nn.Module]:
    """The modules of ``unit`` (``unit[0]`` and those of its descendants listed), each after its own
    children, in definition order (``nn.Module.apply``'s order)."""
    members = set(unit)
    order: list[nn.Module] = []
    seen: set[nn.Module] = set()

    def visit(m: nn.Module) -> None:
        if m in seen:
            return
        seen.add(m)
        for child in m.children():
            if child in members:
                visit(child)
        order.append(m)

    visit(unit[0])
    return order


def user_init_of(root: nn.Module | None) -> InitHook | None:
    """``root.init_weights`` when ``root`` is a :class:`fullshard.Module` that overrides it."""
    from fullshard.module import Module

    if isinstance(root, Module) and type(root).init_weights is not Module.init_weights:
        return root.init_weights
    return None


def init_new_modules(root: nn.Module, hook: InitHook, existing: set[int]) -> None:
    """Eager counterpart of step 3: call ``hook`` on each module of ``root`` holding a parameter
    not in ``existing`` (ids of the parameters before ``configure_model``), children first."""
    fresh = {m for m in root.modules() if any(id(p) not in existing for p in m.parameters())}
    with torch.no_grad():
        for m in children_first([root, *root.modules()]):
            if m in fresh:
                hook(m)


def init_user_layers(model: nn.Module, existing: set[int]) -> None:
    """Run the module's ``init_weights`` override on the layers ``configure_model`` built for real
    (``existing``: ids of the parameters there before; meta-device layers get it as FSDP
    materialises them, see [Note: exact meta-device initialisation]); layers sharded by hand
    inside ``configure_model`` are left alone: FSDP1's ``wrap()``, and ``fully_shard`` or
    ``parallelize_module``, whose parameters are new ``DTensor`` objects holding the old values."""
    hook = user_init_of(model)
    if hook is None or any(p.is_meta for p in model.parameters()):
        return
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return
    split = {id(p) for p in model.parameters() if isinstance(p, DTensor)}
    init_new_modules(model, hook, existing | split)


# ------------------------------------------------------------------- models sharded on the meta device
class ShardedMetaInit:
    """Initialise the meta-device parameters and buffers of a model that was split (tensor
    parallelism) and sharded (FSDP2) while still on the meta device.

    [Note: initialising a model sharded on the meta device]
    Under tensor parallelism the layers are split before anything is initialised (the plan, or
    the user's ``configure_model``, runs on the meta model), so the unit-by-unit
    :class:`MetaInit` cannot run before sharding. Initialising the ``DTensor`` shards in place,
    as ``to_empty()`` followed by ``reset_parameters()`` does, is also wrong on CPU: torch has no
    DTensor random-number tracker there, so every shard of a parameter draws the same numbers
    and the weight is one block repeated. Instead, module by module (children first, as the
    constructors ran), each meta parameter gets its *whole* tensor for a moment: the module's
    ``reset_parameters()``, the nearest HF-style ``_init_weights`` and the user's
    ``init_weights`` run on whole tensors, exactly as on one device, and then each rank keeps its
    part of rank 0's tensor (``distribute_tensor`` with the parameter's own mesh and placements).
    A whole tensor lives until its parent module's turn, so a parent's init can still write into
    its children (``nn.MultiheadAttention`` zeroes its ``out_proj.bias``); a process holds at most
    one module's children whole at a time, never the model. Buffers are not sharded: they are
    allocated and initialised where they are. Tensors that were real stay as they were, and
    everything allocated is NaN-filled first, so that what no init reached is named.

    Args:
        root: the model, split and sharded.
        device: where this rank's shards are allocated.
        user_init: the user's ``Module.init_weights`` when overridden, called per module last.
        owner: what built the model on the meta device, for the error message.
    """

    def __init__(self, root: nn.Module, device: torch.device, user_init: InitHook | None, owner: str) -> None:
        self.root, self.device, self.user_init, self.owner = root, device, user_init, owner
        self.ancestors = _ancestors(root)
        self.names = {m: n for n, m in root.named_modules(remove_duplicate=False)}
        self._whole: dict[int, nn.Parameter] = {}  # a parameter's id -> its whole tensor, during its init
        self._holders: dict[int, int] = {}  # a parameter's id -> modules holding it not finished yet
        self._missing: list[str] = []

    def __call__(self) -> None:
        pending = {m: names for m in self.root.modules() if (names := _meta_names(m))}
        if not pending:
            return
        shared: dict[int, list[tuple[nn.Module, str]]] = {}  # a parameter's id -> where it is held
        for module, names in pending.items():
            for name in names:
                if name in module._parameters:
                    shared.setdefault(id(module._parameters[name]), []).append((module, name))
        # this rank's shards, allocated (FSDP2 re-points its sharded parameters as in to_empty());
        # real tensors stay as they are
        self.root._apply(lambda t: torch.empty_like(t, device=self.device) if t.is_meta else t)
        for holders in shared.values():  # a plain parameter comes back as one new tensor per module
            (first, first_name), *others = holders
            param = first._parameters[first_name]
            for module, name in others:
                module._parameters[name] = param
            self._holders[id(param)] = len(holders)
        waiting: dict[nn.Module, list[tuple[nn.Module, str, nn.Parameter]]] = {}  # parent -> children's
        with torch.no_grad():
            for module in children_first(list(self.root.modules())):
                names = pending.get(module, [])
                whole = [(module, n, self._lend_whole(module, n)) for n in names if n in module._parameters]
                buffers = [n for n in names if n in module._buffers]
                for name in buffers:
                    self._fill_buffer(module, name)
                if names:
                    self._initialise(module)
                for name in buffers:
                    buffer = module._buffers[name]
                    if buffer is not None and _has_nan(_local(buffer)):
                        self._missing.append(self._qualified(module, name))
                for held in waiting.pop(module, []):  # the children's turn is over with their parent's
                    self._finish(*held)
                parents = self.ancestors.get(module)
                if parents:
                    waiting.setdefault(parents[0], []).extend(whole)
                else:
                    for held in whole:
                        self._finish(*held)
        if self._missing:
            shown = ", ".join(self._missing[:8]) + (
                f" and {len(self._missing) - 8} more" if len(self._missing) > 8 else ""
            )
            raise MisconfigurationError(
                f"{self.owner} found the model on the meta device, and nothing initialised {shown}. Give the module a "
                "reset_parameters(), give the model an HF-style _init_weights(module), or override "
                "init_weights(module) on your fullshard.Module to set them; or build those layers off the meta device."
            )

    def _lend_whole(self, module: nn.Module, name: str) -> nn.Parameter:
        """Put the whole (NaN-filled) tensor of ``module.<name>`` in its place; returns the shard."""
        param = module._parameters[name]
        assert param is not None
        whole = self._whole.get(id(param))
        if whole is None:
            if not (param.is_floating_point() or param.is_complex()):
                raise MisconfigurationError(
                    f"The parameter {self._qualified(module, name)} ({param.dtype}) is on the meta device, and only "
                    "floating-point parameters can be initialised there. Build it off the meta device."
                )
            full = torch.full(param.shape, float("nan"), dtype=param.dtype, device=self.device)
            whole = self._whole[id(param)] = nn.Parameter(full, requires_grad=param.requires_grad)
        module._parameters[name] = whole
        return param

    def _fill_buffer(self, module: nn.Module, name: str) -> None:
        buffer = module._buffers[name]
        assert buffer is not None
        if not (buffer.is_floating_point() or buffer.is_complex()):
            raise MisconfigurationError(
                f"The buffer {self._qualified(module, name)} ({buffer.dtype}) is on the meta device, so its values "
                "are lost and cannot be checked after initialisation. Build the layer that owns it off the meta "
                "device (buffers are small), or register it in reset_parameters()."
            )
        buffer.fill_(float("nan"))

    def _initialise(self, module: nn.Module) -> None:
        reset = _reset_of(module)
        if reset is not None:
            reset()
        hook = _model_init(module, self.ancestors)
        if hook is not None:
            hook(module)
        if self.user_init is not None:
            self.user_init(module)

    def _finish(self, module: nn.Module, name: str, shard: nn.Parameter) -> None:
        """Put the shard back; once every module holding it is done, keep this rank's part of the
        whole tensor (rank 0's, so that every rank agrees)."""
        module._parameters[name] = shard
        self._holders[id(shard)] -= 1
        if self._holders[id(shard)]:
            return
        whole = self._whole.pop(id(shard)).detach()
        if _has_nan(whole):
            self._missing.append(self._qualified(module, name))
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(shard, DTensor):
            shard.to_local().copy_(distribute_tensor(whole, shard.device_mesh, shard.placements).to_local())
        else:
            shard.copy_(whole)

    def _qualified(self, module: nn.Module, name: str) -> str:
        prefix = self.names.get(module, "")
        return f"{prefix}.{name}" if prefix else name


def _meta_names(module: nn.Module) -> list[str]:
    """Names of ``module``'s own parameters and buffers on the meta device."""
    own = [*module._parameters.items(), *module._buffers.items()]
    return [name for name, t in own if t is not None and t.is_meta]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
