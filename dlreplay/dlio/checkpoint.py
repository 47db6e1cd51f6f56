"""DLIO's checkpoint sizing: the bytes and files DLIO writes per checkpoint, as DLIO 2.0.0
(the ``checkpoint`` section) and later releases (the ``model`` section) compute them."""

from __future__ import annotations

from dlreplay.model import ModelInfo, Parallelism, Transformer


def dlio_checkpoint_estimate(info: ModelInfo) -> tuple[int, int] | None:
    """(bytes, files) DLIO writes per checkpoint of a transformer model, or None without layers.

    Follows DLIO's ``base_checkpointing.py``: parameters ``P = 2*vocab*h + h +
    L*(2h + 4h^2 + 3h*ffn)``; layer states in fp16 (2 bytes/parameter, one copy,
    ``(L + 3) * tensor`` files unless ZeRO-3); three fp32 optimizer tensors per
    parameter (12 bytes, one file per rank; ZeRO-0 keeps one copy per data-parallel
    replica); plus ``model_size`` bytes and one file per rank when set. Missing
    transformer dimensions take DLIO's defaults (h 2048, ffn 8192, vocab 32000).
    """
    if not info.num_layers:
        return None
    t = info.transformer or Transformer()
    h, ffn, voc = t.hidden_size or 2048, t.ffn_hidden_size or 8192, t.vocab_size or 32000
    layers = info.num_layers
    params = 2 * voc * h + h + layers * (2 * h + 4 * h * h + 3 * h * ffn)
    par = info.parallelism or Parallelism()
    dp = par.data or 1
    mp = par.tensor * par.pipeline
    ranks = mp * dp
    writers = mp if par.zero_stage == -1 else ranks
    optim = 12 * params * (dp if par.zero_stage == 0 else 1)
    layer_files = (layers + 3) * par.tensor if par.zero_stage < 3 else ranks
    total, files = 2 * params + optim, layer_files + writers
    if info.model_size:
        total += info.model_size * writers
        files += writers
    return total, files


#: DLIO 2.0.0's ``checkpoint.layer_parameters`` default: with ``num_layers`` 1 (its default)
#: every checkpoint writes one layer file of these int8 tensors (24.8 MB) beside the model's.
DLIO_2_0_LAYER_PARAMETERS = (17371, 24740228)
#: DLIO releases whose checkpoint sizing :func:`import_dlio` follows: ``2.0.0`` (the PyPI
#: release: ``checkpoint.model_size``, ``optimization_groups``, ``num_layers``,
#: ``layer_parameters``, ``tensor_parallelism``), ``later`` (the ``model`` section:
#: ``model_size_bytes``, ``num_layers``, ``parallelism``, ``transformer``), or ``auto``:
#: ``later`` when the ``model`` section sizes the model, else ``2.0.0``.
DLIO_VERSIONS = ("auto", "2.0.0", "later")
LATER_SIZING = (
    "model.model_size_bytes",
    "model.model_size",
    "model.num_layers",
    "model.layer_parameters",
    "model.optimization_groups",
    "model.parallelism",
    "model.transformer",
)


def dlio_2_0_checkpoint(
    model_size: int = 10240,
    optimization_groups: tuple[int, ...] | list[int] = (),
    num_layers: int = 1,
    layer_parameters: tuple[int, ...] | list[int] = DLIO_2_0_LAYER_PARAMETERS,
    tensor_parallelism: int = 1,
) -> tuple[int, int]:
    """(bytes, files) DLIO 2.0.0 writes per checkpoint and writing rank (its
    ``base_checkpointing.py``; tensors of int8, so bytes = elements, ``torch.save``'s few
    hundred bytes of framing aside): a model file of ``model_size``; with optimization
    groups, one optimizer file of two tensors per group and one of their sum (3 x the
    sum); with layer parameters, ``num_layers`` (plus ``tensor_parallelism`` when above
    1) layer files of their sum each."""
    nbytes = files = 0
    if model_size > 0:
        nbytes, files = model_size, 1
    if optimization_groups:
        nbytes += 3 * sum(g for g in optimization_groups if g > 0)
        files += 1
    layer = sum(p for p in layer_parameters if p > 0)
    if layer and num_layers > 0:
        layers = num_layers + (tensor_parallelism if tensor_parallelism > 1 else 0)
        nbytes += layers * layer
        files += layers
    return nbytes, files
