"""Which nodes of an ATen graph Hologram compiles, and the graph rewritten around them.

A node is supported when the lowering table has an entry for its op and that entry
accepts its arguments: :class:`Support` *tries* the entry on a scratch graph whose inputs
have the node's meta shapes and dtypes (a symbolic size by its hint), so an entry that
raises :class:`~hologram_torch.lowering.Unsupported` for these arguments (integer ``pow``, a
complex dtype, a layout it never handles) leaves the node to PyTorch, at compile time.
Lookups (``embedding``, ``index``, ``index_select``, ``gather``) are the ISA's gather and
their gradients (``embedding_dense_backward``, ``index_put``, ``scatter_add``, ...) its
scatter, one row per index, so they compile at any size; lookups' programs also
compute whether an index was out of range, and the region raises IndexError then, as eager
PyTorch does (:func:`hologram_torch.compile.kernel.build`).

PyTorch's :class:`CapabilityBasedPartitioner` then groups supported nodes into the largest
regions that keep the graph acyclic; views whose values leave a region are left out
(eager, a view is metadata; as a program's output it would be a copy), views used only
inside stay (the program reads through them in place), and so does a dense view that is
the only way a value computed inside leaves (written in its layout: a gradient's ``t`` or
``view``); regions with nothing but views are not compiled. Each region becomes one
:class:`~.kernel.FusedKernel`.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.node import _get_qualified_name
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from hologram.frontend.graph import Graph, Tensor
from hologram_torch.compile import graph_lowerings, stats
from hologram_torch.compile.kernel import FusedKernel
from hologram_torch.compile.options import Options
from hologram_torch.lowering.common import ISA, TORCH

aten = torch.ops.aten

#: Ops that only change a view's metadata: free in eager PyTorch and in a program.
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten._reshape_alias.default,
    aten.alias.default, aten.permute.default, aten.transpose.int, aten.t.default,
    aten.expand.default, aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim,
    aten.squeeze.dims, aten.slice.Tensor, aten.select.int,
})
_VIEW_NAMES = [_get_qualified_name(op) for op in VIEW_OPS]

PREFIX = "hologram_"


def _hint(v):
    """A concrete int, float or bool for a (possibly symbolic) number; None if unknown."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return v.node.hint
    return v


class Support(OperatorSupportBase):
    """``is_node_supported``: the trial lowering described in the module docstring,
    remembered per node."""

    def __init__(self):
        self._known: dict[torch.fx.Node, bool] = {}

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        found = self._known.get(node)
        if found is None:
            found = self._known[node] = self._check(node)
        return found

    def _check(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and self.is_node_supported(None, source)
        if not isinstance(node.target, torch._ops.OpOverload):
            return False
        if graph_lowerings.get(node.target) is None:
            return False
        if not _tensor_result(node.meta.get("val")):
            return False
        try:
            return _trial(node)
        except Exception:  # any failure of a trial means "run it eagerly"
            return False


def _tensor_result(val) -> bool:
    if isinstance(val, torch.Tensor):
        return val.dtype in ISA and val.device.type != "meta"
    if isinstance(val, (tuple, list)) and val:
        return all(v is None or _tensor_result(v) for v in val)
    return False


def _trial(node: torch.fx.Node) -> bool:
    """Does the node's lowering build, with the shapes and dtypes its meta promises?"""
    g = Graph("trial")
    inputs = 0

    def value(arg: torch.fx.Node):
        nonlocal inputs
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            if val.dtype not in ISA:
                raise TypeError(f"dtype {val.dtype}")
            shape = tuple(_hint(n) for n in val.shape)
            strides = tuple(_hint(s) for s in val.stride())
            if None in shape or None in strides:
                raise TypeError("an unbacked size")
            inputs += 1
            return g.strided_input(f"x{inputs}", ISA[val.dtype], shape, strides)
        hinted = _hint(val)
        if not isinstance(hinted, (bool, int, float)):
            raise TypeError(f"argument {val!r}")
        return hinted

    args = torch.fx.node.map_arg(node.args, value)
    kwargs = torch.fx.node.map_arg(node.kwargs, value)
    result = graph_lowerings.lower(node.target, g, *args, **kwargs)
    return _matches(result, node.meta["val"])


def _matches(result, val) -> bool:
    """The lowering's results have the graph's shapes and dtypes (a lowering that disagrees
    with torch's meta function is not trusted with this node)."""
    if isinstance(val, torch.Tensor):
        if not isinstance(result, Tensor):
            return False
        shape = tuple(_hint(n) for n in val.shape)
        return result.shape == shape and TORCH.get(result.dtype) == val.dtype
    if not isinstance(result, (tuple, list)) or len(result) != len(val):
        return False
    return all(v is None or _matches(r, v) for r, v in zip(result, val))


def _is_compute(node: torch.fx.Node) -> bool:
    return node.target is not operator.getitem and node.target not in VIEW_OPS


def _leave_out_escaping_views(nodes: dict) -> None:
    """Take out of a region (``nodes``, in place) every view node whose value would leave
    it: a view used outside the region, or only by views taken out, would be one of the
    program's outputs, written as a copy; eager, it is metadata. Views used only inside
    stay, including those of the region's inputs (a transposed weight): the program reads
    their source in place through the view's strides, and the eager graph makes no call
    for them (a few µs each through the dispatcher).

    A view that is the only way a value the region computes leaves it, and covers its
    elements densely (a gradient reshaped or transposed back to its parameter's shape, an
    ``alias``), stays too: the program writes the view's layout instead of the source's,
    the same bytes, and the graph makes no eager call for it. Nothing outside sees the
    source, so no aliasing is lost."""
    changed = True
    while changed:
        changed = False
        for node in list(nodes):
            if node.target not in VIEW_OPS:
                continue
            outside = [user not in nodes for user in node.users]
            # Only at the region's ends: a view taken from between two of its nodes would
            # make a path out of the region and back in (a cycle); such a view stays.
            at_start = all(source not in nodes for source in node.all_input_nodes)
            if ((at_start and any(outside))
                    or (all(outside) and not _rewrites_its_source(node, nodes))):
                del nodes[node]
                changed = True


def _rewrites_its_source(view: torch.fx.Node, nodes: dict) -> bool:
    """Is ``view``'s value, densely, all the elements of a value computed in the region
    (``nodes``) that nothing outside the region sees but through ``view``?"""
    chain, source = [view], view.args[0]
    while isinstance(source, torch.fx.Node) and source in nodes and source.target in VIEW_OPS:
        chain.append(source)
        source = source.args[0]
    if not (isinstance(source, torch.fx.Node) and source in nodes
            and source.target not in VIEW_OPS):
        return False
    for node, seen_by in zip(chain[1:] + [source], chain):
        if any(_escapes(user, nodes) for user in node.users if user is not seen_by):
            return False
    val, base = view.meta.get("val"), source.meta.get("val")
    return (isinstance(val, torch.Tensor) and isinstance(base, torch.Tensor)
            and val.numel() == base.numel()
            and torch._prims_common.is_non_overlapping_and_dense_or_false(val))


def _escapes(node: torch.fx.Node, nodes: dict) -> bool:
    """Does ``node``'s value, or a view of it, leave the region ``nodes``?"""
    return node not in nodes or any(
        user not in nodes or (user.target in VIEW_OPS and _escapes(user, nodes))
        for user in node.users)


def partition(gm: torch.fx.GraphModule, name: str, options: Options) -> torch.fx.GraphModule:
    """``gm`` with each supported region replaced by a :class:`FusedKernel` (in place);
    counts partitions and ops lowered and left eager."""
    partitioner = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True,
                                             non_compute_ops=_VIEW_NAMES)
    regions = partitioner.propose_partitions()
    for region in regions:
        _leave_out_escaping_views(region.nodes)
    regions = [r for r in regions if any(_is_compute(n) for n in r.nodes)]
    lowered = {n for r in regions for n in r.nodes}
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node.target is not operator.getitem
                and isinstance(node.meta.get("val"), (torch.Tensor, tuple, list))):
            if node in lowered:
                stats.add("ops_lowered")
            elif node.target in VIEW_OPS:
                stats.add("views_eager")
            else:
                stats.add("ops_eager")
                stats.add_eager_op(str(node.target))
    stats.add("partitions", len(regions))
    if not regions:
        return gm
    fused = partitioner.fuse_partitions(regions, prefix=PREFIX)
    for child, sub in list(fused.named_children()):
        if child.startswith(PREFIX) and isinstance(sub, torch.fx.GraphModule):
            setattr(fused, child, FusedKernel(sub, f"{name}_{child}", options))
    fused.recompile()
    return fused
