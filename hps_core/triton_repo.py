"""Write Triton model folders that serve ps.json models through ``triton_backend``.

Used by ``hps repo`` (a HugeCTR user's ps.json -> a ready model repository) and by
``hps prepare`` for the default repository, so both produce the same layout::

    <repo>/<model>/config.pbtxt
    <repo>/<model>/ps.json         the ps.json, file paths relative to this folder when inside
    <repo>/<model>/1/model.py      one import of triton_backend
    <repo>/<model>/warmup/...      a warm-up request that loads the tables before READY

A new version of a model (``hps repo ... --version N``, :func:`write_repository` with
``version``) adds ``<repo>/<model>/<N>/model.py`` and ``<repo>/<model>/<N>/ps.json``: that
version's own ps.json, naming its own sparse, dense and network files, which the backend
prefers to the model folder's (:func:`triton_backend.model_settings.read_settings`). Triton's
default version policy serves the highest version, so loading the model again (``hps reload``)
switches to it. With ``freeze_sparse`` (HugeCTR's hps-backend config.pbtxt parameter) a new
version keeps the sparse files of the version it replaces, so its tables are not re-read and
the rows that online updates wrote into the shared host tier survive the switch.

A ps.json model with ``network_file`` and ``dense_file`` is a ranking model (lookup + dense
network) and gets two Triton models over the same files: ``<model>`` with HugeCTR's
``hugectr`` backend contract (``DES``, ``CATCOLUMN``, ``ROWINDEX`` -> ``OUTPUT0``), and
``<model>_samples``, one sample per row of Triton's batch (``dense``, ``sparse`` -> ``score``),
which reads ``../<model>/ps.json``. Any other model gets the ``hps`` lookup contract
(``KEYS``, ``NUMKEYS`` -> ``OUTPUT0``). See :mod:`hps_core.infer.contracts`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from hps_core.config import ModelConfig, PSConfig, load_ps_config
from hps_core.errors import ConfigError, Problem
from hps_core.infer import RankingLayout, is_ranking_model, load_ranking_graph
from hps_core.infer.model_io import (
    CATCOLUMN,
    DES,
    EMBEDDING_IO,
    EMBEDDING_IO_UNBATCHED,
    FREEZE_SPARSE_PARAMETER,
    HPS_MODEL_PARAMETER,
    KEYS,
    NUMKEYS,
    PS_JSON_PARAMETER,
    ROWINDEX,
    SHARE_CACHE_PARAMETER,
    ModelIO,
    hugectr_io,
    samples_io,
)

EMBEDDING_MODEL_PY = '''\
"""Triton entry point: HugeCTR's `hps` lookup contract (KEYS, NUMKEYS -> OUTPUT0)."""

from triton_backend.embedding_model import EmbeddingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''

HUGECTR_RANKING_MODEL_PY = '''\
"""Triton entry point: HugeCTR's `hugectr` contract (DES, CATCOLUMN, ROWINDEX -> OUTPUT0)."""

from triton_backend.ranking_model import HugeCTRRankingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''

SAMPLES_RANKING_MODEL_PY = '''\
"""Triton entry point: one sample per batch row (dense, sparse -> score)."""

from triton_backend.ranking_model import SamplesRankingModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''

#: Suffix of the Triton model that serves a ranking model one sample per batch row.
SAMPLES_SUFFIX = "_samples"


@dataclass(frozen=True)
class InstanceGroup:
    """One ``instance_group`` entry of config.pbtxt.

    Args:
        count: instances per device (per GPU for ``KIND_GPU``).
        kind: ``KIND_CPU``, ``KIND_GPU`` or ``KIND_AUTO``.
        gpus: GPUs of ``KIND_GPU`` instances; empty means every visible GPU.
    """

    count: int = 2
    kind: str = "KIND_CPU"
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class ServingOptions:
    """How Triton batches and places a generated model.

    Args:
        max_batch_size: requests Triton's dynamic batcher may hand to one ``execute`` (for a
            ``_samples`` ranking model Triton counts samples instead, and the ps.json
            ``max_batch_size`` is used); 0: no batching, each request as it is (HugeCTR's
            HPS ensemble samples).
        max_queue_delay_us: how long the batcher waits to fill a batch.
        instances: the instance groups.
        warmup: add a warm-up request that loads the tables before the model is READY.
        share_gpu_cache: GPU instances on one GPU share its dynamic caches (parameter
            ``share_gpu_cache``); ``False`` gives each instance its own copy.
        freeze_sparse: write HugeCTR's ``freeze_sparse`` parameter: a new version of the
            model keeps the sparse files of the version it replaces (see
            :func:`write_repository`).
    """

    max_batch_size: int = 16
    max_queue_delay_us: int = 100
    instances: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    warmup: bool = True
    share_gpu_cache: bool = True
    freeze_sparse: bool = False


def placed_on_deployed_devices(options: ServingOptions, model: ModelConfig) -> ServingOptions:
    """GPU instance groups that name no GPUs go on the model's ``deployed_device_list``.

    HugeCTR builds a model's embedding caches on the devices of that list; without ``gpus``
    Triton would put an instance on every visible GPU, some of them not in the list.

    Args:
        options: batching and placement as asked for.
        model: the model served.

    Returns:
        The options with those groups placed.
    """
    groups = tuple(
        replace(g, gpus=tuple(model.deployed_device_list))
        if g.kind == "KIND_GPU" and not g.gpus
        else g
        for g in options.instances
    )
    return replace(options, instances=groups)


@dataclass(frozen=True)
class WarmupInput:
    """One input of the warm-up request: a file in ``warmup/``, or zeros when ``file`` is
    ``None``; its dims (one request's) may differ from the contract's ``-1``."""

    name: str
    dims: tuple[int, ...]
    file: str | None = None


def config_pbtxt(
    name: str,
    max_batch_size: int,
    options: ServingOptions,
    io: ModelIO,
    params: Sequence[tuple[str, str]],
    warmup: Sequence[WarmupInput],
) -> str:
    """The text of a Python-backend config.pbtxt, built as Triton's ``ModelConfig`` message
    (warm-up only if ``options.warmup``)."""
    config = pb.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    if max_batch_size > 0:  # 0: Triton hands each request over as it is, unbatched
        config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    for spec in io.inputs:
        config.input.add(
            name=spec.name,
            data_type=pb.DataType.Value(spec.data_type),
            dims=spec.dims,
            allow_ragged_batch=spec.ragged and max_batch_size > 0,
        )
    for spec in io.outputs:
        config.output.add(
            name=spec.name, data_type=pb.DataType.Value(spec.data_type), dims=spec.dims
        )
    for group in options.instances:
        config.instance_group.add(
            count=group.count, kind=pb.ModelInstanceGroup.Kind.Value(group.kind), gpus=group.gpus
        )
    params = list(params)
    if any(g.kind != "KIND_CPU" for g in options.instances):
        # GPU instances take inputs where the client put them (e.g. CUDA shared memory),
        # so keys already on the GPU are never copied to the host and back.
        params.append(("FORCE_CPU_ONLY_INPUT_TENSORS", "no"))
        params.append((SHARE_CACHE_PARAMETER, "true" if options.share_gpu_cache else "false"))
    if options.freeze_sparse:
        params.append((FREEZE_SPARSE_PARAMETER, "true"))
    for key, value in params:
        config.parameters[key].string_value = value
    if options.warmup and warmup:
        sample = config.model_warmup.add(name="load_tables", batch_size=1)
        types = {spec.name: spec.data_type for spec in io.inputs}
        for item in warmup:
            entry = sample.inputs[item.name]
            entry.data_type = pb.DataType.Value(types[item.name])
            entry.dims.extend(item.dims)
            if item.file:
                entry.input_data_file = item.file
            else:
                entry.zero_data = True
    return text_format.MessageToString(config)


def _ranking_parameters(triton_name: str, hps_model: str, ps_json: str) -> list[tuple[str, str]]:
    params = [(PS_JSON_PARAMETER, ps_json)]
    if hps_model != triton_name:
        params.append((HPS_MODEL_PARAMETER, hps_model))
    return params


def embedding_config_pbtxt(
    triton_name: str, model: ModelConfig, options: ServingOptions, hps_model: str | None = None
) -> str:
    """config.pbtxt of an embedding-lookup model (HugeCTR ``hps`` contract).

    Args:
        triton_name: the Triton model name (the folder name).
        model: the ps.json model it serves.
        options: batching and placement.
        hps_model: the ps.json model name when it differs from ``triton_name``.

    Returns:
        The file's text.
    """
    params = [
        (PS_JSON_PARAMETER, "ps.json"),
        ("embedding_vecsize_per_table", ",".join(str(t.dim) for t in model.tables)),
        ("table_names", ",".join(t.name for t in model.tables)),
    ]
    if hps_model and hps_model != triton_name:
        params.append((HPS_MODEL_PARAMETER, hps_model))
    t = len(model.tables)
    batched = options.max_batch_size > 0
    shape = (t,) if batched else (1, t)  # without batching, the request's whole shape
    return config_pbtxt(
        triton_name,
        options.max_batch_size,
        options,
        EMBEDDING_IO if batched else EMBEDDING_IO_UNBATCHED,
        params=params,
        warmup=[WarmupInput(KEYS, shape, "keys"), WarmupInput(NUMKEYS, shape, "numkeys")],
    )


def hugectr_config_pbtxt(
    triton_name: str, layout: RankingLayout, options: ServingOptions, long_keys: bool = True
) -> str:
    """config.pbtxt of a ranking model with HugeCTR's ``hugectr`` backend contract.

    Triton's ``max_batch_size`` counts requests here (each request flattens its samples into
    one row); the samples per request are limited by the ps.json ``max_batch_size``. The
    ``des_feature_num``, ``slots`` and ``label_dim`` parameters are informational, named as
    in HugeCTR's backend; the network file decides them.

    Args:
        triton_name: the Triton model name (the folder name).
        layout: the model's tables, slots and widths (``layout.model`` is the ps.json model).
        options: batching and placement.
        long_keys: the ps.json's ``supportlonglong``: INT64 ``CATCOLUMN``, else UINT32 (as
            HugeCTR's backend takes 32-bit keys).

    Returns:
        The file's text.
    """
    slots, tables = layout.total_slots, layout.num_tables
    params = [
        *_ranking_parameters(triton_name, layout.model, "ps.json"),
        ("des_feature_num", str(layout.dense_dim)),
        ("slots", ",".join(str(s) for s in layout.slot_nums)),
        ("label_dim", str(layout.label_dim)),
    ]
    return config_pbtxt(
        triton_name,
        options.max_batch_size,
        options,
        hugectr_io(long_keys),
        params=params,
        # One sample, one key (0) per slot: loading every table is the point.
        warmup=[
            WarmupInput(DES, (layout.dense_dim,)),
            WarmupInput(CATCOLUMN, (slots,)),
            WarmupInput(ROWINDEX, (slots + tables,), "rowindex"),
        ],
    )


def samples_config_pbtxt(
    triton_name: str, layout: RankingLayout, options: ServingOptions, ps_json: str
) -> str:
    """config.pbtxt of a ranking model served one sample per row of Triton's batch.

    Triton's ``max_batch_size`` counts samples here: the ps.json ``max_batch_size``.

    Args:
        triton_name: the Triton model name (the folder name).
        layout: the model's tables, slots and widths (``layout.model`` is the ps.json model).
        options: queue delay, placement and warm-up (``max_batch_size`` is not used).
        ps_json: the ps.json, relative to this model's folder.

    Returns:
        The file's text.
    """
    io = samples_io(layout.dense_dim, layout.sample_width, layout.label_dim)
    return config_pbtxt(
        triton_name,
        layout.max_batch_size,
        options,
        io,
        params=_ranking_parameters(triton_name, layout.model, ps_json),
        warmup=[WarmupInput(spec.name, spec.dims) for spec in io.inputs],
    )


def write_file(path: Path, data: str | bytes) -> None:
    """Write a file whole or not at all (a temporary file beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    os.replace(tmp, path)


def write_ps_json(folder: Path, config: PSConfig) -> None:
    """Write ``config`` as ``<folder>/ps.json``, its paths relative to the folder where they
    can be."""
    write_file(folder / "ps.json", json.dumps(config.to_dict(relative_to=folder), indent=2) + "\n")


def _version_folder(folder: Path, version: int | None) -> Path:
    """The folder of ``version`` in a model folder (``1`` when no version is asked for;
    version 0 is a folder of its own, as Triton serves it)."""
    return folder / str(1 if version is None else version)


def model_versions(folder: Path) -> list[int]:
    """The versions a Triton model folder holds: its numeric subfolders with a ``model.py``.

    Args:
        folder: a model folder of a repository.

    Returns:
        The version numbers, ascending (empty when the folder does not exist).

    Example:
        >>> model_versions(Path("model_repository/hps_embedding"))  # doctest: +SKIP
        [1, 2]
    """
    if not folder.is_dir():
        return []
    return sorted(
        int(entry.name)
        for entry in folder.iterdir()
        if entry.name.isdigit() and (entry / "model.py").is_file()
    )


def version_ps_json(folder: Path, version: int) -> Path:
    """The ps.json that ``version`` of a model folder serves.

    The version's own ``<folder>/<version>/ps.json`` when it has one, else the model folder's
    ``ps.json`` (the layout of a repository written without ``--version``). The backend
    resolves it the same way (:func:`triton_backend.model_settings.read_settings`).

    Args:
        folder: the model folder.
        version: the version.

    Returns:
        The path (which may not exist).
    """
    own = folder / str(version) / "ps.json"
    return own if own.is_file() else folder / "ps.json"


def read_config(path: Path) -> pb.ModelConfig:
    """A config.pbtxt parsed with Triton's own schema.

    Args:
        path: the file.

    Returns:
        Its ``ModelConfig`` message.

    Raises:
        ConfigError: the file is not a valid model configuration (the parser's message names
            the line and column).
    """
    try:
        return text_format.Parse(path.read_text(), pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError([Problem(str(path), f"not a Triton model configuration: {exc}")]) from exc


def write_config(path: Path, config: pb.ModelConfig) -> None:
    """Write ``config`` to ``path`` as config.pbtxt text (replacing the file at once), the
    inverse of :func:`read_config`.

    Args:
        path: the file.
        config: a ``ModelConfig`` message.
    """
    write_file(path, text_format.MessageToString(config))


def is_frozen(folder: Path) -> bool:
    """Whether a model folder's config.pbtxt sets ``freeze_sparse`` to true."""
    path = folder / "config.pbtxt"
    if not path.is_file():
        return False
    parameter = read_config(path).parameters.get(FREEZE_SPARSE_PARAMETER)
    return parameter is not None and parameter.string_value.strip().lower() in ("true", "yes", "1")


def _check_new_version(folder: Path, version: int) -> list[Problem]:
    """Problems with adding ``version`` to a model folder (empty when it can be added)."""
    where = f"{folder} version {version}"
    existing = model_versions(folder)
    if version in existing:
        return [
            Problem(
                where,
                "already exists; versions are not rewritten while they may be served, add "
                f"version {max(existing) + 1} instead",
            )
        ]
    if existing and max(existing) > version:
        return [
            Problem(
                where,
                f"would not be served: Triton serves the highest version and {max(existing)} "
                f"exists; use --version {max(existing) + 1}",
            )
        ]
    return []


def frozen_sparse_files(folder: Path, version: int, model: ModelConfig) -> ModelConfig:
    """``model`` with the sparse files of the version of ``folder`` that ``version`` replaces.

    HugeCTR's hps backend with ``freeze_sparse`` does not re-read the sparse files when a new
    version of a model loads: the tables stay as they are in its databases, online updates
    included. Here the new version's ps.json names the previous version's sparse files, so its
    processes open the same shared host-tier segments (named by the files' identity) while the
    old version still holds them.

    Args:
        folder: the model folder.
        version: the version being added.
        model: the new version's model (its dense and network files are kept).

    Returns:
        The model with the previous sparse files, or ``model`` unchanged when the folder has
        no earlier version.

    Raises:
        ConfigError: the earlier version's tables differ in number, names or dims.
    """
    earlier = [v for v in model_versions(folder) if v < version]
    if not earlier:
        return model
    source = version_ps_json(folder, max(earlier))
    previous = load_ps_config(source).model(model.name)
    where = f"{source} model '{model.name}'"
    old = [(t.name, t.dim) for t in previous.tables]
    new = [(t.name, t.dim) for t in model.tables]
    if old != new:
        raise ConfigError(
            Problem(
                where,
                f"freeze_sparse keeps its tables {old}, but the new version has {new}; "
                "a model with other tables goes into a new repository (or under another "
                "model name), written without --freeze-sparse",
            )
        )
    return replace(model, sparse_files=previous.sparse_files)


def write_embedding_model(
    repo_dir: Path,
    config: PSConfig,
    model: ModelConfig,
    options: ServingOptions | None = None,
    triton_name: str | None = None,
    version: int | None = None,
) -> Path:
    """Write one embedding-lookup model folder.

    Args:
        repo_dir: the model repository.
        config: the whole ps.json (written into the folder).
        model: the model to serve.
        options: batching and placement.
        triton_name: folder / Triton name; the ps.json model name by default.
        version: write this version (0 included, as HugeCTR's samples number theirs) with
            its own ps.json in ``<folder>/<version>/``; ``None`` writes version 1 with the
            ps.json in the model folder.

    Returns:
        The model folder.
    """
    options = placed_on_deployed_devices(options or ServingOptions(), model)
    name = triton_name or model.name
    folder = (repo_dir / name).resolve()
    write_file(folder / "config.pbtxt", embedding_config_pbtxt(name, model, options, model.name))
    version_dir = _version_folder(folder, version)
    write_file(version_dir / "model.py", EMBEDDING_MODEL_PY)
    write_ps_json(version_dir if version is not None else folder, config)
    if options.warmup:
        # One key per table: loading every table is the point, the key need not exist.
        t = len(model.tables)
        write_file(folder / "warmup" / "keys", np.zeros(t, dtype="<i8").tobytes())
        write_file(folder / "warmup" / "numkeys", np.ones(t, dtype="<i4").tobytes())
    return folder


def ranking_layout(config: PSConfig, model: ModelConfig) -> RankingLayout:
    """Check a ranking model's network and dense files against its ps.json entry.

    Args:
        config: the whole ps.json.
        model: one of its models, with ``network_file`` and ``dense_file``.

    Returns:
        The model's layout.

    Raises:
        ConfigError: a problem naming the ps.json field.
        NotAvailableError: the network has layers the engine cannot run.
    """
    return load_ranking_graph(model, f"models[{config.models.index(model)}]")[1]


def write_ranking_model(
    repo_dir: Path,
    config: PSConfig,
    model: ModelConfig,
    options: ServingOptions | None = None,
    triton_name: str | None = None,
    version: int | None = None,
    samples: bool = True,
) -> list[Path]:
    """Write the two Triton models of a ranking model: ``<name>`` and ``<name>_samples``.

    Args:
        repo_dir: the model repository.
        config: the whole ps.json (written into the first folder; the second reads it).
        model: the model to serve, with ``network_file`` and ``dense_file``.
        options: batching and placement.
        triton_name: name of the first folder / Triton model; the ps.json model name by
            default.
        version: write this version of both models (0 included), each with its own copy of
            the ps.json in ``<folder>/<version>/``; ``None`` writes version 1 with one ps.json
            in the first folder.
        samples: also write ``<name>_samples`` (``False``: the ``hugectr`` contract alone).

    Returns:
        The model folders written.

    Raises:
        ConfigError: the network or dense file does not fit the ps.json entry.
    """
    options = placed_on_deployed_devices(options or ServingOptions(), model)
    layout = ranking_layout(config, model)
    name = triton_name or model.name
    folder = (repo_dir / name).resolve()
    text = hugectr_config_pbtxt(name, layout, options, config.supportlonglong)
    write_file(folder / "config.pbtxt", text)
    write_file(_version_folder(folder, version) / "model.py", HUGECTR_RANKING_MODEL_PY)
    write_ps_json(_version_folder(folder, version) if version is not None else folder, config)
    if options.warmup:
        rows = np.concatenate([np.arange(s + 1) for s in layout.slot_nums])
        write_file(folder / "warmup" / "rowindex", rows.astype("<i4").tobytes())
    if not samples:
        return [folder]
    samples_name = name + SAMPLES_SUFFIX
    samples_folder = (repo_dir / samples_name).resolve()
    text = samples_config_pbtxt(samples_name, layout, options, f"../{name}/ps.json")
    write_file(samples_folder / "config.pbtxt", text)
    write_file(_version_folder(samples_folder, version) / "model.py", SAMPLES_RANKING_MODEL_PY)
    if version is not None:
        write_ps_json(_version_folder(samples_folder, version), config)
    return [folder, samples_folder]


def triton_folders(repo: Path, model: ModelConfig) -> list[Path]:
    """The Triton model folders :func:`write_repository` writes for one ps.json model.

    Args:
        repo: the model repository.
        model: the ps.json model.

    Returns:
        ``<repo>/<model>``, and ``<repo>/<model>_samples`` for a ranking model.
    """
    folder = (repo / model.name).resolve()
    if is_ranking_model(model):
        return [folder, (repo / (model.name + SAMPLES_SUFFIX)).resolve()]
    return [folder]


def write_repository(
    ps_json: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: ServingOptions,
    version: int | None = None,
) -> list[Path]:
    """Write a model repository serving every model of a ps.json.

    Every ranking model is checked before anything is written. With ``version``, each model
    gets that version next to the ones it has (the version folder holds its own ps.json), to
    be served once the model is loaded again (``hps reload``); a model whose config.pbtxt
    sets ``freeze_sparse`` (or ``options.freeze_sparse``) keeps the sparse files of its
    previous version (:func:`frozen_sparse_files`). An existing config.pbtxt keeps what the
    operator set there (instances, batching, version policy, parameters such as the
    precision): only the inputs, outputs and warm-up follow the new version's files.

    Args:
        ps_json: the HugeCTR ps.json.
        out_dir: the repository folder (created if needed).
        options: batching and placement of every model.
        version: the version to add (1 or more, above every version the models have);
            ``None`` writes version 1 the way a repository without versions is laid out.

    Returns:
        The model folders written.

    Raises:
        ConfigError: every problem of every ranking model, or a version that exists or
            would not be served.
        NotAvailableError: a network has layers the engine cannot run.

    Example:
        >>> write_repository("v2/ps.json", "model_repository", ServingOptions(), version=2)
        ... # doctest: +SKIP
        [PosixPath('.../model_repository/hps_embedding')]
    """
    config = load_ps_config(ps_json)
    repo = Path(out_dir)
    problems: list[Problem] = []
    if version is not None and version < 1:
        raise ConfigError(Problem("--version", f"must be 1 or more, got {version}"))
    frozen: dict[str, bool] = {}
    if version is None:
        # Version 1 is rewritten in place; over later versions it would no longer be what
        # they were added to (and not be served: Triton serves the highest).
        for model in config.models:
            for folder in triton_folders(repo, model):
                if [v for v in model_versions(folder) if v != 1]:
                    problems.append(Problem(
                        str(folder),
                        f"has versions {model_versions(folder)}; writing it again would "
                        "rewrite version 1 under them: add a version (--version N) or write "
                        "a new repository",
                    ))  # fmt: skip
    if version is not None:
        models = []
        for model in config.models:
            folders = triton_folders(repo, model)
            for folder in folders:
                problems.extend(_check_new_version(folder, version))
            frozen[model.name] = options.freeze_sparse or is_frozen(folders[0])
            if frozen[model.name] and not problems:
                try:
                    model = frozen_sparse_files(folders[0], version, model)
                except ConfigError as exc:
                    problems.extend(exc.problems)
            models.append(model)
        config = replace(config, models=tuple(models))
    for model in config.models:
        if is_ranking_model(model):
            try:
                ranking_layout(config, model)
            except ConfigError as exc:
                problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    folders = []
    for model in config.models:
        # A frozen model stays frozen: its config.pbtxt keeps the parameter.
        own = replace(options, freeze_sparse=options.freeze_sparse or frozen.get(model.name, False))
        before = {}
        if version is not None:
            before = {f: read_config(f / "config.pbtxt") for f in triton_folders(repo, model)
                      if (f / "config.pbtxt").is_file()}  # fmt: skip
        if is_ranking_model(model):
            written = write_ranking_model(repo, config, model, own, version=version)
        else:
            written = [write_embedding_model(repo, config, model, own, version=version)]
        for folder in written:
            if folder in before:
                _keep_operator_settings(folder / "config.pbtxt", before[folder])
        folders.extend(written)
    return folders


def _keep_operator_settings(path: Path, before: pb.ModelConfig) -> None:
    """Rewrite the config.pbtxt just written at ``path`` as ``before`` (what the operator
    set: instances, batching, version policy, parameters) with the written one's inputs,
    outputs, warm-up (where ``before`` had one) and the parameters the writer owns."""
    written = read_config(path)
    kept = pb.ModelConfig()
    kept.CopyFrom(before)
    del kept.input[:], kept.output[:]
    kept.input.extend(written.input)
    kept.output.extend(written.output)
    if before.model_warmup:
        del kept.model_warmup[:]
        kept.model_warmup.extend(written.model_warmup)
    for key in (PS_JSON_PARAMETER, HPS_MODEL_PARAMETER, FREEZE_SPARSE_PARAMETER):
        if key in written.parameters:
            kept.parameters[key].CopyFrom(written.parameters[key])
    write_config(path, kept)
