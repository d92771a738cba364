"""The ``dlrm`` workload: an ads-style recommender (DLRM, Naumov et al. 2019) on synthetic data.

The model: ``num_tables`` embedding tables (``nn.EmbeddingBag``, sum pooling of ``pooling``
lookups per sample, ``rows`` x ``emb_dim`` each), a bottom MLP taking ``dense_features`` dense
inputs to ``emb_dim``, a feature interaction and a top MLP ending in one logit, trained with
binary cross-entropy. Interaction ``"dot"``: the pairwise dot products of the ``num_tables + 1``
vectors (bottom output and pooled embeddings), strictly below the diagonal, next to the bottom
output; ``"cat"``: the vectors concatenated. Each rank makes one fixed batch of ``batch_size``
samples on its device from a seeded generator: dense features ~ N(0, 1), indices uniform over the
rows, labels Bernoulli(1/2). Plain PyTorch (``EmbeddingBag``, ``torch.distributed``); TorchRec
is not used (see the project's notes for why).

System knobs: ``batch_size`` (per rank), ``sparse_grads`` (sparse embedding gradients: the
optimizer touches only the rows looked up), ``optimizer`` (``sgd``, ``adagrad``, ``adam``; with
sparse gradients ``adam`` uses ``SparseAdam`` for the tables), and with several ranks
``embedding_sharding``:

* ``"replicated"``: every rank holds every table; the whole model is data parallel (DDP; sparse
  gradients are all-reduced as sparse tensors, which gloo supports and NCCL does not).
* ``"table_wise"``: table ``t`` lives on rank ``t % world_size`` (model parallel); per step, each
  rank sends the indices of its batch to the tables' owners (all-to-all), owners pool the bags
  of the global batch, and the pooled vectors come back to the ranks that own the samples
  (all-to-all, and its reverse in the backward pass, averaged over the ranks as DDP averages).
  The dense part is data parallel (DDP). Both shardings train the same model step for step.

FLOPs per optimizer step (:func:`flops_per_step`), matmuls only::

    B * (6 * sum(in * out over MLP layers) - 2 * dense_features * bottom_width_1
         + 6 * (num_tables + 1)**2 * emb_dim  [dot only])

(the first bottom layer needs no input gradient, so it costs 4, not 6, FLOPs per weight and
sample; the interaction's batched matmul costs 2 forward and 4 backward per element). Embedding
lookups and pooling, activations, the loss and the optimizer are not counted: they move memory
rather than multiply. ``B`` is the global batch, ``batch_size * world_size``.

Importing this module imports no torch; :meth:`DLRMWorkload.build` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from ..errors import ConfigError
from .base import Built, Knob, Workload, seeded_on
from .parallel import World

__all__ = ["FLOPS_CONVENTION", "KNOBS", "DLRMWorkload", "cost_terms", "flops_per_step",
           "mlp_widths"]

KNOBS: dict[str, Knob] = {
    "num_tables": Knob(default=8, type=int, low=1, doc="embedding tables (sparse features)"),
    "rows": Knob(default=20000, type=int, low=2, unit="rows", doc="rows per table"),
    "emb_dim": Knob(default=32, type=int, low=1, doc="embedding dimension"),
    "pooling": Knob(default=8, type=int, low=1, unit="lookups", doc="lookups pooled per bag"),
    "dense_features": Knob(default=13, type=int, low=1, doc="dense inputs (13 as in Criteo)"),
    "bottom_width": Knob(default=128, type=int, low=1, doc="bottom MLP hidden width"),
    "bottom_layers": Knob(default=2, type=int, low=0, doc="bottom MLP hidden layers"),
    "top_width": Knob(default=256, type=int, low=1, doc="top MLP hidden width"),
    "top_layers": Knob(default=2, type=int, low=0, doc="top MLP hidden layers"),
    "interaction": Knob(default="dot", type=str, choices=("dot", "cat"),
                        doc="feature interaction: pairwise dot products or concatenation"),
    "batch_size": Knob(default=512, type=int, low=1, unit="samples", doc="samples per rank"),
    "sparse_grads": Knob(default=False, type=bool, doc="sparse embedding gradients"),
    "optimizer": Knob(default="adagrad", type=str, choices=("sgd", "adagrad", "adam"),
                      doc="optimizer (adam + sparse_grads: SparseAdam for the tables)"),
    "embedding_sharding": Knob(default="replicated", type=str,
                               choices=("replicated", "table_wise"),
                               doc="with several ranks: tables replicated (DDP) or one owner "
                                   "per table (all-to-all)"),
    "threads": Knob(default=0, type=int, low=0, unit="threads",
                    doc="torch CPU threads; 0 leaves torch's default"),
    "lr": Knob(default=0.01, type=float, low=0.0, doc="learning rate"),
    "seed": Knob(default=0, type=int, low=0, doc="seed of the weights and the synthetic data"),
}

FLOPS_CONVENTION = ("dlrm matmuls: B*(6*sum(in*out of MLP layers) - 2*dense_features*first "
                    "bottom width + 6*(tables+1)^2*emb_dim if dot); embedding lookups, pooling, "
                    "activations, loss not counted; B = global batch")


def mlp_widths(cfg: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """Layer widths (input first, output last) of the bottom and the top MLP."""
    d, t = cfg["emb_dim"], cfg["num_tables"]
    bottom = [cfg["dense_features"], *[cfg["bottom_width"]] * cfg["bottom_layers"], d]
    top_in = d + (t + 1) * t // 2 if cfg["interaction"] == "dot" else d * (t + 1)
    top = [top_in, *[cfg["top_width"]] * cfg["top_layers"], 1]
    return bottom, top


def flops_per_step(cfg: Mapping[str, Any], world_size: int = 1) -> float:
    """Model FLOPs of one optimizer step, the convention above."""
    bottom, top = mlp_widths(cfg)
    per_sample = sum(6 * a * b for w in (bottom, top) for a, b in zip(w, w[1:], strict=False))
    per_sample -= 2 * bottom[0] * bottom[1]  # no gradient for the input features
    if cfg["interaction"] == "dot":
        per_sample += 6 * (cfg["num_tables"] + 1) ** 2 * cfg["emb_dim"]
    return float(per_sample * cfg["batch_size"] * world_size)


def cost_terms(cfg: Mapping[str, Any]) -> list[float]:
    """Rough costs per sample of one training step, for a GP's analytical prior mean
    (``GPPredictor(space, cost_model=...)``): a roofline-style sum whose weights the GP fits.

    Returns ``[flops, lookups, table_updates, overhead]``, each per sample and in its own unit:
    MLP and interaction FLOPs (:func:`flops_per_step`); embedding elements gathered (tables x
    pooling x emb_dim); embedding elements the optimizer updates (dense gradients update every
    row of every table once per step, shared by the batch; sparse ones only the rows looked
    up); and per-step fixed costs shared by the batch. Threads and the optimizer's kind are
    left to the GP's kernel.

    Example:
        >>> cfg = {k: knob.default for k, knob in KNOBS.items()}
        >>> [round(t) for t in cost_terms(cfg)]
        [644288, 2048, 10000, 0]
    """
    b, d, tables = cfg["batch_size"], cfg["emb_dim"], cfg["num_tables"]
    lookups = tables * cfg["pooling"] * d
    updates = lookups if cfg.get("sparse_grads") else tables * cfg["rows"] * d / b
    return [flops_per_step(cfg) / b, float(lookups), float(updates), 1.0 / b]


#: Names of :func:`cost_terms`' values, in order (``GPPredictor.cost_shares`` columns).
cost_terms.term_names = ("flops", "lookups", "table_updates", "overhead")


@lru_cache(maxsize=1)
def _classes() -> tuple[type, type, type]:
    """Define the torch modules on first use, so that importing this module needs no torch."""
    import torch
    import torch.distributed as dist
    from torch import nn

    def mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
            layers.append(nn.Linear(a, b))
            if last_relu or i < len(widths) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    class DenseArch(nn.Module):
        """Bottom MLP, interaction, top MLP: ``(dense (B, F), pooled (B, T, D)) -> logits (B,)``."""

        def __init__(self, cfg: Mapping[str, Any]) -> None:
            super().__init__()
            bottom, top = mlp_widths(cfg)
            self.bottom, self.top = mlp(bottom, last_relu=True), mlp(top, last_relu=False)
            self.dot = cfg["interaction"] == "dot"
            li, lj = torch.tril_indices(cfg["num_tables"] + 1, cfg["num_tables"] + 1, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)

        def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
            z = self.bottom(dense)  # (B, D)
            feats = torch.cat([z.unsqueeze(1), pooled], dim=1)  # (B, T + 1, D)
            if self.dot:
                inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
                top_in = torch.cat([z, inter], dim=1)
            else:
                top_in = feats.flatten(1)
            return self.top(top_in).squeeze(1)

    class Replicated(nn.Module):
        """Every table here: ``(dense (B, F), idx (T, B, P)) -> logits (B,)``."""

        def __init__(self, tables: nn.ModuleList, dense: nn.Module) -> None:
            super().__init__()
            self.tables, self.dense = tables, dense

        def forward(self, dense: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            pooled = torch.stack([tab(idx[t]) for t, tab in enumerate(self.tables)], dim=1)
            return self.dense(dense, pooled)

    class AllToAll(torch.autograd.Function):
        """``all_to_all_single`` with splits along dim 0; backward sends gradients back."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, out_rows: list[int], in_rows: list[int]
                    ) -> torch.Tensor:
            ctx.out_rows, ctx.in_rows = out_rows, in_rows
            out = x.new_empty((sum(out_rows), *x.shape[1:]))
            dist.all_to_all_single(out, x.contiguous(), out_rows, in_rows)
            return out

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
            back = grad.new_empty((sum(ctx.in_rows), *grad.shape[1:]))
            dist.all_to_all_single(back, grad.contiguous(), ctx.in_rows, ctx.out_rows)
            return back, None, None

    return DenseArch, Replicated, AllToAll


def _tables(cfg: Mapping[str, Any], ids: list[int], device: Any) -> Any:
    """The embedding tables ``ids``, each seeded by its own id (same weights on whichever rank
    holds it), made on ``device``."""
    from torch import nn

    tables = nn.ModuleList()
    for t in ids:
        with seeded_on(device, cfg["seed"] * 100_003 + t):
            tables.append(nn.EmbeddingBag(cfg["rows"], cfg["emb_dim"], mode="sum",
                                          sparse=cfg["sparse_grads"]))
    return tables


class DLRMWorkload(Workload):
    """DLRM-style recommender on synthetic clicks; units are samples."""

    name = "dlrm"
    version = "1"
    units = "samples"
    #: Its trials' CPU drift references: dlrm steps of 256 samples with 1,000 and 20,000 rows
    #: per table, on one scale. A trial is gauged by the one whose mix of memory and compute is
    #: nearest its own (:meth:`drift_reference_for`): how a step slows as the machine drifts
    #: depends on how much of it streams the tables through the optimizer (dense gradients
    #: update every row every step) rather than multiplies, and a cache-sized reference does not
    #: feel what slows a memory-bound step. A matmul-bound MLP does not follow dlrm at all
    #: (:class:`~cubicml_lab.hardware.StepReference`).
    drift_references = ({"batch_size": 256, "rows": 1000}, {"batch_size": 256, "rows": 20000})

    def drift_reference_for(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        """The drift reference whose optimizer updates per FLOP (:func:`cost_terms`: table
        elements updated per sample over matmul FLOPs per sample) are nearest, in log, to
        ``config``'s: the tables' memory traffic against the MLPs' arithmetic.

        Example:
            >>> w = DLRMWorkload()
            >>> [w.drift_reference_for(w.resolve({"batch_size": b}))["rows"] for b in (512, 4096)]
            [20000, 1000]
        """
        def mix(cfg: Mapping[str, Any]) -> float:
            flops, _, updates, _ = cost_terms(cfg)
            return math.log(updates / flops)

        own = mix(self.resolve(config))
        return min(self.drift_references, key=lambda ref: abs(mix(self.resolve(ref)) - own))

    def knobs(self) -> dict[str, Knob]:
        return dict(KNOBS)

    def check_world(self, config: Mapping[str, Any], world_size: int) -> None:
        cfg = self.resolve(config)
        if (world_size > 1 and cfg["embedding_sharding"] == "table_wise"
                and cfg["num_tables"] < world_size):
            raise ConfigError(
                f"embedding_sharding = 'table_wise' puts one table per rank at least, but "
                f"num_tables = {cfg['num_tables']} < world size {world_size}",
                hint="use at least as many tables as processes, or 'replicated'")

    def build(self, config: Mapping[str, Any], device: str, world: World | None = None) -> Built:
        """Tables, dense arch, fixed synthetic batch and optimizers on ``device``."""
        import torch
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel

        cfg = self.resolve(config)
        world = world if world is not None else World(device=device)
        self.check_world(cfg, world.world_size)
        dev, n_tab, w = torch.device(device), cfg["num_tables"], world.world_size
        sharded = world.distributed and cfg["embedding_sharding"] == "table_wise"
        if world.distributed and cfg["sparse_grads"] and not sharded and dev.type == "cuda":
            raise ConfigError("sparse_grads with embedding_sharding = 'replicated' on CUDA: "
                              "NCCL cannot all-reduce sparse gradients",
                              hint="use sparse_grads = False, or embedding_sharding = "
                                   "'table_wise' (sparse gradients stay local)")
        dense_cls, replicated_cls, all_to_all = _classes()
        owners = [t % w if sharded else world.rank for t in range(n_tab)]
        mine = [t for t in range(n_tab) if owners[t] == world.rank]
        tables = _tables(cfg, mine, dev)
        with seeded_on(dev, cfg["seed"]):
            dense = dense_cls(cfg)
        n_params = (sum(p.numel() for p in dense.parameters())
                    + n_tab * cfg["rows"] * cfg["emb_dim"])
        model = dense if sharded else replicated_cls(tables, dense)
        if world.distributed:  # sharded: the dense part only; replicated: everything
            ids = [dev.index] if dev.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        b = cfg["batch_size"]
        gen = torch.Generator(device=dev).manual_seed(cfg["seed"] + 1_000_003 * world.rank)
        x_dense = torch.randn(b, cfg["dense_features"], generator=gen, device=dev)
        idx = torch.randint(0, cfg["rows"], (n_tab, b, cfg["pooling"]), generator=gen, device=dev)
        labels = torch.randint(0, 2, (b,), generator=gen, device=dev).float()
        opt = _optimizers(cfg, tables, list(dense.parameters()))
        pooled_sharded = _sharded_pooling(cfg, idx, tables, owners, mine, w, all_to_all, dev)

        def step() -> Any:
            logits = model(x_dense, pooled_sharded()) if sharded else model(x_dense, idx)
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            loss.backward()
            for o in opt:
                o.step()
                o.zero_grad(set_to_none=True)
            return loss.detach()

        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else None
        return Built(step=step, units_per_step=b * w, flops_per_step=flops_per_step(cfg, w),
                     flops_convention=FLOPS_CONVENTION, sync=sync, model_params=n_params,
                     precision="fp32", n_devices=w,
                     parallel={"embedding_sharding": cfg["embedding_sharding"] if w > 1 else
                               "local", "tables_here": len(mine)},
                     matmul_rows=b)


def _sharded_pooling(cfg: Mapping[str, Any], idx: Any, tables: Any, owners: list[int],
                     mine: list[int], w: int, all_to_all: Any, dev: Any) -> Callable[[], Any]:
    """Table-wise sharding's lookup: a function returning every table's pooled embeddings for
    this rank's batch, ``(B, T, D)``. Each table's indices ``idx`` (``(T, B, P)``) go to the rank
    that owns it (``owners``; this rank holds ``tables``, the ids ``mine``), which pools them for
    all ``w`` ranks' batches, and the bags come back (two ``all_to_all`` exchanges)."""
    import torch

    n_tab, b = cfg["num_tables"], cfg["batch_size"]
    # Table order as the owners send them back: all of rank 0's tables, then rank 1's...
    by_owner = sorted(range(n_tab), key=lambda t: (owners[t], t))
    unsort = torch.tensor([by_owner.index(t) for t in range(n_tab)], device=dev)
    counts = [sum(1 for t in range(n_tab) if owners[t] == r) for r in range(w)]
    owner_order = torch.tensor(by_owner, device=dev)

    def pooled_sharded() -> torch.Tensor:  # (B, T, D), every table, from their owners
        send = idx[owner_order].flatten(1)  # (T, B * P) in owner order
        got = all_to_all.apply(send, [len(mine)] * w, counts)  # (w * mine, B * P)
        got = got.view(w, len(mine), b, cfg["pooling"]).transpose(0, 1)
        bags = torch.stack([tab(got[i].reshape(w * b, -1)) for i, tab in enumerate(tables)])
        bags = bags.view(len(mine), w, b, -1).transpose(0, 1).reshape(w * len(mine), b, -1)
        if bags.requires_grad:  # each rank's loss is a mean over its own batch: average the
            bags.register_hook(lambda g: g / w)  # ranks' gradients, as DDP does (replicated)
        back = all_to_all.apply(bags, counts, [len(mine)] * w)  # (T, B, D) in owner order
        return back[unsort].transpose(0, 1)

    return pooled_sharded


def _optimizers(cfg: Mapping[str, Any], tables: Any, dense_params: list[Any]) -> list[Any]:
    """Optimizers for the tables and the dense part (one when both can share it)."""
    import torch

    lr, name = cfg["lr"], cfg["optimizer"]
    table_params = list(tables.parameters())
    if name == "adam" and cfg["sparse_grads"]:
        out = [torch.optim.Adam(dense_params, lr=lr)]
        return out + ([torch.optim.SparseAdam(table_params, lr=lr)] if table_params else [])
    cls = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[name]
    return [cls(table_params + dense_params, lr=lr)]
