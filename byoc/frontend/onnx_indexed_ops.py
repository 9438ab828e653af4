"""Converters of ONNX's multi-dimensional indexing ops into byoc's gather and elementwise ops:
GatherND, ScatterND and ScatterElements. Both appear where exporters index with tensors: torch's default
exporter writes `mask[:, None, None, :]` as a GatherND of constant indices, and Swin's
shifted-window mask is built with ScatterND (`mask[h, w] = count`).

GatherND views `data` as [batch, block, rest...] (block: the dims one index tuple picks
among) and gathers rows of it at each tuple's linear position. Constant indices (the
common case) are checked and linearized at import time; indices computed at run time are
linearized with elementwise ops, and a tuple with an out-of-range component becomes an
index past the gathered axis, so that the gather kernel reports it at run time, as it does
for Gather.

ScatterND's and ScatterElements' indices must be known at import time (byoc compiles static graphs; exporters
write them as constants or from shapes): the positions each update writes are then known,
and the op becomes a gather of the updates and a `where` over data, one round per update
that lands on an already written position (reductions apply in the order ONNX defines).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from ..ir.expr import Constant
from .onnx import MAX_FOLDED_BYTES, converter


def _check_components(ctx, indices: np.ndarray, block: tuple, what: str) -> np.ndarray:
    """Index tuples with negative components counted from the end; out of range: an error."""
    sizes = np.asarray(block, dtype=np.int64)
    bad = (indices < -sizes) | (indices >= sizes)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ModelError(f"{ctx.node_label}: {what}[{', '.join(map(str, position))}] = {int(indices[position])} "
                         f"is out of range for a dim of size {int(sizes[position[-1]])}; expected "
                         f"-size <= index < size")
    return np.where(indices < 0, indices + sizes, indices)


def _strides(block: tuple) -> np.ndarray:
    return np.asarray([math.prod(block[j + 1:]) for j in range(len(block))], dtype=np.int64)


@converter("GatherND")
def _gather_nd(ctx, node, inputs, attrs):
    data, indices = inputs
    data_shape, index_shape = tuple(ctx.shape(data)), tuple(ctx.shape(indices))
    batch_dims = attrs.get("batch_dims", 0)
    if not index_shape or not data_shape:
        raise ModelError(f"{ctx.node_label}: data {list(data_shape)} and indices {list(index_shape)} must both "
                         f"have rank >= 1")
    tuple_len = index_shape[-1]
    if not 0 <= batch_dims < min(len(data_shape), len(index_shape)) or batch_dims + tuple_len > len(data_shape):
        raise ModelError(f"{ctx.node_label}: batch_dims={batch_dims} with data {list(data_shape)} and indices "
                         f"{list(index_shape)}; expected 0 <= batch_dims < both ranks and batch_dims + "
                         f"indices.shape[-1] <= rank of data")
    if data_shape[:batch_dims] != index_shape[:batch_dims]:
        raise ModelError(f"{ctx.node_label}: the first {batch_dims} dims of data {list(data_shape)} and indices "
                         f"{list(index_shape)} differ; expected the same batch dims")
    batch, block = data_shape[:batch_dims], data_shape[batch_dims:batch_dims + tuple_len]
    rest = data_shape[batch_dims + tuple_len:]
    rows = math.prod(batch) * math.prod(block)
    flat = ctx.call("reshape", data, shape=(rows,) + rest)
    # each tuple's batch: its leading indices dims, as an offset of whole blocks
    tuple_dims = index_shape[:-1]
    batch_offset = (np.arange(math.prod(batch), dtype=np.int64) * math.prod(block)).reshape(
        batch + (1,) * (len(tuple_dims) - batch_dims))
    strides = _strides(block)
    # constant indices are linearized here; those computed at run time by the ops below
    known = indices if isinstance(indices, np.ndarray) else indices.data if isinstance(indices, Constant) else None
    if known is not None or tuple_len == 0:
        components = np.zeros(index_shape, np.int64) if known is None else np.asarray(known, dtype=np.int64)
        components = _check_components(ctx, components, block, "indices")
        linear = (components * strides).sum(axis=-1) + batch_offset
        return [ctx.call("gather", flat, np.ascontiguousarray(linear, dtype=np.int64), axis=0,
                         name=node.output[0])]
    components = indices if ctx.dtype(indices) == "int64" else ctx.call("cast", indices, dtype="int64")
    sizes = np.asarray(block, dtype=np.int64)
    wrapped = ctx.call("where", ctx.call("less", components, np.zeros((), np.int64)),
                       ctx.call("add", components, sizes), components)
    valid = ctx.call("logical_and", ctx.call("greater_equal", wrapped, np.zeros((), np.int64)),
                     ctx.call("less", wrapped, sizes))
    invalid = ctx.call("sum", ctx.call("cast", ctx.call("logical_not", valid), dtype="int64"), axes=(-1,),
                       keepdims=False)
    linear = ctx.call("add", ctx.call("sum", ctx.call("multiply", wrapped, strides), axes=(-1,), keepdims=False),
                      batch_offset)
    # a tuple with a component out of range: an index below -rows, which gather reports
    past = np.asarray(-rows - 1, dtype=np.int64)
    linear = ctx.call("where", ctx.call("equal", invalid, np.zeros((), np.int64)), linear, past)
    return [ctx.call("gather", flat, linear, axis=0, name=node.output[0])]


_SCATTER_REDUCTIONS = {"none": None, "add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


@converter("ScatterND")
def _scatter_nd(ctx, node, inputs, attrs):
    data, indices, updates = inputs
    reduction = _reduction(ctx, attrs)
    data_shape, update_shape = tuple(ctx.shape(data)), tuple(ctx.shape(updates))
    index_array = np.asarray(ctx.known(indices, "indices"), dtype=np.int64)
    index_shape = index_array.shape
    if not index_shape or not data_shape or index_shape[-1] > len(data_shape):
        raise ModelError(f"{ctx.node_label}: indices {list(index_shape)} with data {list(data_shape)}; expected "
                         f"indices of rank >= 1 whose last dim is at most the rank of data")
    tuple_len = index_shape[-1]
    block, rest = data_shape[:tuple_len], data_shape[tuple_len:]
    if update_shape != index_shape[:-1] + rest:
        raise ModelError(f"{ctx.node_label}: updates {list(update_shape)}; expected indices.shape[:-1] + "
                         f"data.shape[indices.shape[-1]:] = {list(index_shape[:-1] + rest)}")
    components = _check_components(ctx, index_array, block, "indices")
    targets = (components * _strides(block)).sum(axis=-1).reshape(-1)  # each update's row of data
    rows, count = math.prod(block), len(targets)
    data_rows = ctx.call("reshape", data, shape=(rows,) + rest)
    update_rows = ctx.call("reshape", updates, shape=(count,) + rest)
    result = _scatter_rows(ctx, data_rows, update_rows, targets, rows, rest, reduction)
    return [ctx.call("reshape", result, shape=data_shape, name=node.output[0])]


def _reduction(ctx, attrs) -> str:
    reduction = attrs.get("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in _SCATTER_REDUCTIONS:
        raise ModelError(f"{ctx.node_label}: reduction={reduction!r}; expected one of "
                         f"{', '.join(_SCATTER_REDUCTIONS)}")
    return reduction


# a scatter's maps (which rows a round writes, and from which update) are constants of one
# entry per row of data: as large as the importer folds
MAX_SCATTER_ROWS = MAX_FOLDED_BYTES // 8


def _check_scatter_size(ctx, rows: int, what: str):
    if rows > MAX_SCATTER_ROWS:
        raise ModelError(f"{ctx.node_label}: scatters into data of {rows} {what}; byoc lowers a scatter to "
                         f"constant maps of one entry per {what[:-1]}, made at import time; expected at most "
                         f"{MAX_SCATTER_ROWS} {what}")


def _scatter_rows(ctx, data_rows, update_rows, targets: np.ndarray, rows: int, rest: tuple, reduction: str):
    """data_rows ([rows, *rest]) with update_rows[u] written to row targets[u], in order:
    round r writes, for each row, the r-th update that lands on it (without a reduction
    only the last one counts). Each round's rows written and their sources are constants of
    `rows` entries, so their size is checked before they are made."""
    _check_scatter_size(ctx, rows, "rows")
    count = len(targets)
    if reduction == "none":  # the last update of each row: the largest update index landing there
        last = np.full(rows, -1, dtype=np.int64)
        np.maximum.at(last, targets, np.arange(count, dtype=np.int64))
        rounds = [np.flatnonzero(last >= 0)] if count else []
        sources = [last[rounds[0]]] if count else []
    else:  # each update's rank among those landing on its row, in update order
        order = np.argsort(targets, kind="stable")
        ordered = targets[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if count else np.zeros(0, np.int64)
        group = np.cumsum(np.r_[True, ordered[1:] != ordered[:-1]]) - 1 if count else np.zeros(0, np.int64)
        rank = np.arange(count) - starts[group]
        rounds, sources = [], []
        for r in range(int(rank.max()) + 1 if count else 0):
            chosen = order[rank == r]
            rounds.append(targets[chosen])
            sources.append(chosen)
    result = data_rows
    combine = _SCATTER_REDUCTIONS[reduction]
    for written_rows, source_updates in zip(rounds, sources):
        written = np.zeros(rows, dtype=bool)
        written[written_rows] = True
        source = np.zeros(rows, dtype=np.int64)
        source[written_rows] = source_updates
        picked = ctx.call("gather", update_rows, source, axis=0)
        if combine is not None:
            picked = ctx.call(combine, result, picked)
        result = ctx.call("where", written.reshape((rows,) + (1,) * len(rest)), picked, result)
    return result


@converter("ScatterElements")
def _scatter_elements(ctx, node, inputs, attrs):
    """Element i of updates goes to data at i's position with its `axis` coordinate replaced
    by indices[i]: with the indices known, each update's element of the flattened data is
    known, and the scatter is ScatterND's over one-element rows."""
    data, indices, updates = inputs
    reduction = _reduction(ctx, attrs)
    data_shape, update_shape = tuple(ctx.shape(data)), tuple(ctx.shape(updates))
    index_array = np.asarray(ctx.known(indices, "indices"), dtype=np.int64)
    rank = len(data_shape)
    axis = attrs.get("axis", 0)
    if not -rank <= axis < rank:
        raise ModelError(f"{ctx.node_label}: axis={axis} for data of rank {rank}; expected -{rank} <= axis < {rank}")
    axis %= rank
    if index_array.shape != update_shape or len(update_shape) != rank or \
            any(u > d for position, (u, d) in enumerate(zip(update_shape, data_shape)) if position != axis):
        raise ModelError(f"{ctx.node_label}: indices {list(index_array.shape)} and updates {list(update_shape)} with "
                         f"data {list(data_shape)}; expected indices and updates of one shape, of data's rank, "
                         f"within data off the axis")
    size = data_shape[axis]
    bad = (index_array < -size) | (index_array >= size)
    if bad.any():
        position = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ModelError(f"{ctx.node_label}: indices[{', '.join(map(str, position))}] = {int(index_array[position])} "
                         f"is out of range for axis {axis} of size {size}; expected -size <= index < size")
    _check_scatter_size(ctx, math.prod(data_shape), "elements")
    coordinates = list(np.indices(update_shape, dtype=np.int64)) if update_shape else []
    coordinates[axis] = np.where(index_array < 0, index_array + size, index_array)
    targets = np.ravel_multi_index(tuple(coordinates), data_shape).reshape(-1) if coordinates else \
        np.zeros(0, np.int64)
    elements = math.prod(data_shape)
    data_rows = ctx.call("reshape", data, shape=(elements, 1))
    update_rows = ctx.call("reshape", updates, shape=(len(targets), 1))
    result = _scatter_rows(ctx, data_rows, update_rows, targets, elements, (1,), reduction)
    return [ctx.call("reshape", result, shape=data_shape, name=node.output[0])]
