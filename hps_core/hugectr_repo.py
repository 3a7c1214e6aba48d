"""A model repository written for HugeCTR's Triton backends, served by this project's.

HugeCTR users start Triton on a repository whose models say ``backend: "hps"`` (embedding
lookups: ``KEYS``, ``NUMKEYS`` -> ``OUTPUT0``) or ``backend: "hugectr"`` (ranking models:
``DES``, ``CATCOLUMN``, ``ROWINDEX`` -> ``OUTPUT0``), with the ps.json given at server start
(``--backend-config=hps,ps=PS.json``, ``--backend-config=hugectr,ps=PS.json``).
:func:`translate_repository` writes a repository of this project's Python-backend models
that serve those models with the same request contracts, the user's repository untouched:

- each ``hps``/``hugectr`` model becomes the model :mod:`hps_core.triton_repo` writes for its
  ps.json entry (the Triton model's name is the ps.json model's, as in HugeCTR), with the
  config.pbtxt's ``max_batch_size``, ``instance_group``, ``dynamic_batching`` queue delay and
  ``version_policy`` and one model folder per version folder it has (``0`` included, as
  hugectr_backend's hps-triton-ensemble sample numbers its model's), and the user's ps.json
  (``source_ps_json``), which the model's load log, its warnings and errors name
  (:func:`user_paths` names the user's files in Triton's messages too);
- config.pbtxt parameters are applied as HugeCTR's backends apply them (over the ps.json):
  both backends ``refresh_interval``, ``refresh_delay``, ``freeze_sparse``; the ``hugectr``
  backend also ``config`` (the network file), ``sparse_files``, ``dense_file``, ``gpucache``
  (must agree with the ps.json), ``gpucacheper`` and ``hit_rate_threshold`` (at most the
  ps.json's), ``mixed_precision`` (an FP16 network); its sizing parameters (``label_dim``,
  ``slots``, ``des_feature_num``: widths; ``cat_feature_num``, ``embedding_vector_size``,
  ``max_nnz``: bounds) are checked against the network file, which decides them, and each
  one that disagrees is named; ``embeddingkey_long_type`` (over the ps.json's
  ``supportlonglong``) chooses INT64 or UINT32 ``CATCOLUMN``; every other parameter is named
  as not honoured; values are read as HugeCTR reads them (``"True"``, ``"1"``, ``"20.0"``);
- on a machine without a usable GPU, ``KIND_GPU`` instances run as ``KIND_CPU`` (said so);
- models of other backends are linked unchanged.

Example:
    >>> notes = translate_repository(Path("repo"), {"hps": Path("ps.json")}, Path("/tmp/out"))
    ... # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from hps_core.config import ModelConfig, PSConfig, load_ps_config
from hps_core.errors import ConfigError, HPSError, Problem
from hps_core.infer.inputs.layout import load_ranking_graph
from hps_core.infer.model_io import (
    FREEZE_SPARSE_PARAMETER,
    PRECISION_PARAMETER,
    SOURCE_PS_JSON_PARAMETER,
)
from hps_core.model_check import relative_path_hint
from hps_core.triton_repo import (
    InstanceGroup,
    ServingOptions,
    read_config,
    write_config,
    write_embedding_model,
    write_ranking_model,
)
from hps_core.wording import plural

BACKENDS = ("hps", "hugectr")
"""HugeCTR's backends this project stands in for."""

_BOTH = {"refresh_interval", "refresh_delay", FREEZE_SPARSE_PARAMETER}
_RANKING = {
    "config", "sparse_files", "dense_file", "gpucache", "gpucacheper", "hit_rate_threshold",
    "mixed_precision", "embeddingkey_long_type",
}  # fmt: skip
_WIDTHS = ("label_dim", "slots", "des_feature_num")  # must equal the network's
_BOUNDS = ("cat_feature_num", "embedding_vector_size", "max_nnz")  # must hold the network's
_SIZING = {*_WIDTHS, *_BOUNDS}


def split_backend_configs(args: Sequence[str]) -> tuple[dict[str, Path], list[str]]:
    """Take HugeCTR's ``--backend-config=<hps|hugectr>,ps=PATH`` out of tritonserver options.

    Args:
        args: tritonserver options (``--backend-config=X`` or ``--backend-config X``).

    Returns:
        The ps.json of each backend given one (resolved against the current directory), and
        the other options, in order.

    Example:
        >>> split_backend_configs(["--backend-config=hps,ps=/m/ps.json", "--log-info=true"])
        ({'hps': PosixPath('/m/ps.json')}, ['--log-info=true'])
    """
    found: dict[str, Path] = {}
    rest: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        item = items[i]
        value = None
        if item.startswith("--backend-config="):
            value = item.split("=", 1)[1]
        elif item == "--backend-config" and i + 1 < len(items):
            value = items[i + 1]
        backend, _, setting = (value or "").partition(",")
        key, _, path = setting.partition("=")
        if value is not None and backend in BACKENDS and key == "ps" and path:
            found[backend] = Path(path).resolve()
            i += 2 if item == "--backend-config" else 1
            continue
        rest.append(item)
        i += 1
    return found, rest


def hugectr_models(repo: Path) -> dict[str, str]:
    """The models of ``repo`` served by HugeCTR's backends: folder name -> backend.

    Args:
        repo: a Triton model repository.

    Returns:
        Each model folder whose config.pbtxt names ``hps`` or ``hugectr`` as its backend.

    Raises:
        ConfigError: a config.pbtxt does not parse.
    """
    found = {}
    for folder in sorted(p for p in repo.iterdir() if (p / "config.pbtxt").is_file()):
        backend = read_config(folder / "config.pbtxt").backend
        if backend in BACKENDS:
            found[folder.name] = backend
    return found


def translate_repository(
    repo: Path, ps_files: Mapping[str, Path], out: Path, gpu: bool = False
) -> list[str]:
    """Write into ``out`` a repository that serves ``repo`` through this project's backend.

    Args:
        repo: the HugeCTR repository (read only).
        ps_files: the ps.json of each HugeCTR backend (``--backend-config``).
        out: an empty or missing folder.
        gpu: a GPU is usable here (else ``KIND_GPU`` instances become ``KIND_CPU``).

    Returns:
        One line per setting changed or not honoured, naming the model and the setting.

    Raises:
        ConfigError: a model's backend has no ps.json, its ps.json has no such model, or a
            setting contradicts the ps.json as HugeCTR's backend refuses it (every problem
            of every model, each naming its file and field).
    """
    out.mkdir(parents=True, exist_ok=True)
    backends = hugectr_models(repo)
    notes: list[str] = []
    problems: list[Problem] = []
    for folder in sorted(p for p in repo.iterdir() if p.is_dir()):
        backend = backends.get(folder.name)
        if backend is None:
            os.symlink(folder.resolve(), out / folder.name, target_is_directory=True)
            continue
        try:
            notes += translate_model(folder, backend, ps_files, out, gpu)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return notes


def translate_model(
    folder: Path, backend: str, ps_files: Mapping[str, Path], out: Path, gpu: bool = False
) -> list[str]:
    """Write into ``out`` the translation of one model of a HugeCTR backend (see the module
    docstring).

    Args:
        folder: the model's folder in the user's repository.
        backend: ``hps`` or ``hugectr``.
        ps_files: the ps.json of each HugeCTR backend.
        out: the translated repository.
        gpu: a GPU is usable here.

    Returns:
        Its notes (settings changed or not honoured).

    Raises:
        ConfigError: as :func:`translate_repository`, for this model.
    """
    where = str(folder / "config.pbtxt")
    user = read_config(folder / "config.pbtxt")
    name = user.name or folder.name
    if name != folder.name:
        raise ConfigError(Problem(where, f"name '{name}' differs from its folder '{folder.name}'"))
    ps_json = ps_files.get(backend)
    if ps_json is None:
        raise ConfigError(
            Problem(
                where,
                f"backend '{backend}' reads its ps.json from the server's command line: pass "
                f"`-- --backend-config={backend},ps=PS.json` (as to tritonserver)",
            )
        )
    try:
        config = load_ps_config(ps_json)
    except ConfigError as exc:  # two backends may each have a ps.json: say which
        located = [p if str(ps_json) in p.where else Problem(f"{ps_json}: {p.where}", p.message)
                   for p in exc.problems]  # fmt: skip
        raise ConfigError(located) from None
    model = config.model(name)  # the ps.json model has the Triton model's name, as in HugeCTR
    notes = _relative_path_notes(config, model, ps_json)
    params = {key: value.string_value.strip() for key, value in user.parameters.items()}
    model, precision, long_keys, applied = _apply_parameters(
        folder, backend, model, params, ps_json
    )
    notes += applied
    if long_keys is not None and long_keys != config.supportlonglong:
        # This model's own copy of the ps.json carries the width its parameter asks for.
        config = replace(config, supportlonglong=long_keys)
    if backend == "hugectr" and not config.supportlonglong:
        notes.append("32-bit keys: CATCOLUMN is UINT32, as in HugeCTR's backend")
    if backend == "hugectr":
        notes += _sizing_notes(model, params, where)
    notes = [f"model '{name}' (backend {backend}): {note}" for note in notes]
    options, placement_notes = _serving_options(user, gpu)
    notes += [f"model '{name}' (backend {backend}): {note}" for note in placement_notes]
    frozen = FREEZE_SPARSE_PARAMETER in params and _flag(
        params, FREEZE_SPARSE_PARAMETER, f"{where} parameters"
    )
    options = replace(options, freeze_sparse=frozen)
    config = replace(config, models=tuple(model if m.name == name else m for m in config.models))
    versions = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    for version in versions or [1]:
        at = None if versions in ([], [1]) else version
        if backend == "hps":
            write_embedding_model(out, config, model, options, name, at)
        else:
            write_ranking_model(out, config, model, options, name, at, samples=False)
    _carry_over(out / name / "config.pbtxt", user, precision, ps_json)
    return notes


def user_paths(text: str, translation: Path, repository: Path) -> str:
    """``text`` (a message of Triton's about the translated repository ``translation / "repo"``)
    naming the user's files: a translated model's ps.json as the user's ps.json it was written
    from (its config.pbtxt's ``source_ps_json``), any other path in the translation as the
    same path in the user's ``repository``.

    Args:
        text: the message.
        translation: the folder :func:`translate_repository` wrote into ``repo`` of.
        repository: the user's repository.

    Returns:
        The message, naming no file of the translation.

    Example:
        >>> user_paths("/tmp/t/repo/emb/ps.json: bad", Path("/tmp/t"), Path("/m"))
        ... # doctest: +SKIP
        '/m/ps/emb.json: bad'
    """
    translated = translation / "repo"
    if str(translated) not in text:
        return text

    def source(match: re.Match[str]) -> str:
        try:
            parameters = read_config(translated / match[1] / "config.pbtxt").parameters
        except (ConfigError, OSError):
            return match[0]
        if SOURCE_PS_JSON_PARAMETER not in parameters:
            return match[0]
        return parameters[SOURCE_PS_JSON_PARAMETER].string_value or match[0]

    ps_json = re.escape(str(translated)) + r"/([^/\s'\"]+)/(?:\d+/)?ps\.json"
    return re.sub(ps_json, source, text).replace(str(translated), str(repository))


def _relative_path_notes(config: PSConfig, model: ModelConfig, ps_json: Path) -> list[str]:
    """A note per file of ``model`` that its ps.json gives relative to the server's working
    folder, as HugeCTR reads it (the hps-triton-ensemble sample's
    ``model/hps_test/0/hps_sparse.model``): here it is read from the ps.json's folder, where
    it does not exist, and the model will not load."""
    m = config.models.index(model)
    files = [(f"sparse_files[{t.index}]", t.sparse_file) for t in model.tables]
    files += [("dense_file", model.dense_file), ("network_file", model.network_file)]
    return [
        f"{ps_json}: models[{m}].{key}: {path} does not exist{hint}"
        for key, path in files
        if path is not None and (hint := relative_path_hint(config, path))
    ]


def _apply_parameters(
    folder: Path, backend: str, model: ModelConfig, params: Mapping[str, str], ps_json: Path
) -> tuple[ModelConfig, str | None, bool | None, list[str]]:
    """``model`` with the config.pbtxt parameters HugeCTR's backend applies, the dense
    network's precision they ask for (or None: the ps.json's ``use_mixed_precision``
    decides), the key width ``embeddingkey_long_type`` asks for (or None: the ps.json's
    ``supportlonglong``), and notes on what is not honoured or changed.

    Values are read as HugeCTR's backends read them: booleans ``true``/``false`` in any case or
    an integer (non-zero is true), numbers from their text (``"20.0"`` is an integer)."""
    where = f"{folder / 'config.pbtxt'} parameters"
    changes: dict[str, object] = {}
    notes: list[str] = []
    precision = None
    long_keys = None
    known = _BOTH | (_RANKING | _SIZING if backend == "hugectr" else set())
    unread = sorted(key for key in params if key not in known)
    if unread:
        notes.append(
            f"parameters not read by HugeCTR's {backend} backend, ignored here too: "
            + ", ".join(unread)
        )
    if "refresh_interval" in params:
        seconds = _number(params, "refresh_interval", float, where)
        if seconds < 0:
            raise ConfigError(
                Problem(f"{where}.refresh_interval", f"{seconds:g} is negative (0: no refresh)")
            )
        whole = max(1, math.ceil(seconds)) if seconds > 0 else 0
        if whole != seconds:
            notes.append(
                f"refresh_interval {params['refresh_interval']} runs every {whole} s here (the "
                "refresher counts whole seconds, as ps.json's refresh_interval)"
            )
        changes["refresh_interval"] = whole
    if "refresh_delay" in params:
        changes["refresh_delay"] = _number(params, "refresh_delay", float, where)
    if backend == "hugectr":
        for key, field in (("config", "network_file"), ("dense_file", "dense_file")):
            if params.get(key):
                changes[field] = _path(folder, params[key])
        if params.get("sparse_files"):
            files = [_path(folder, f) for f in params["sparse_files"].split(",") if f.strip()]
            changes["sparse_files"] = tuple(files)
        if "gpucache" in params and _flag(params, "gpucache", where) != model.gpucache:
            raise ConfigError(
                Problem(
                    f"{where}.gpucache",
                    f"'{params['gpucache']}' disagrees with the ps.json's gpucache "
                    f"({str(model.gpucache).lower()}, {ps_json}); HugeCTR refuses it too",
                )
            )
        for key in ("gpucacheper", "hit_rate_threshold"):
            if key not in params:
                continue
            value = _number(params, key, float, where)
            limit = getattr(model, key)
            # HugeCTR compares them with the ps.json's only where the GPU cache is on.
            if value > limit and model.gpucache:
                raise ConfigError(
                    Problem(
                        f"{where}.{key}",
                        f"{value} is more than the ps.json's {limit} ({ps_json}); "
                        "HugeCTR refuses it too",
                    )
                )
            changes[key] = value
        if "mixed_precision" in params:
            precision = "fp16" if _flag(params, "mixed_precision", where) else "fp32"
        if "embeddingkey_long_type" in params:
            long_keys = _flag(params, "embeddingkey_long_type", where)
    return replace(model, **changes), precision, long_keys, notes


def _flag(params: Mapping[str, str], key: str, where: str) -> bool:
    """``params[key]`` as HugeCTR's backends read a boolean: ``true``/``false`` in any case, or
    an integer, non-zero for true; anything else names the parameter."""
    text = params[key].strip().lower()
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text) != 0
    except ValueError:
        raise ConfigError(
            Problem(f"{where}.{key}", f"'{params[key]}' is not true, false or an integer")
        ) from None


def _number(params: Mapping[str, str], key: str, kind: type, where: str) -> Any:
    """``params[key]`` as ``kind`` (int or float); an integer may be written ``"20.0"``. A value
    that is not one names the parameter."""
    text = params[key].strip()
    noun = "an integer" if kind is int else "a number"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (kind is int and not value.is_integer()):
        raise ConfigError(Problem(f"{where}.{key}", f"'{params[key]}' is not {noun}"))
    return kind(value)


def _sizing_notes(model: ModelConfig, params: Mapping[str, str], where: str) -> list[str]:
    """Notes on the ``hugectr`` backend's sizing parameters that disagree with the network.

    HugeCTR's backend sizes its request buffers by ``label_dim``, ``slots`` and
    ``des_feature_num`` (exact widths of a sample) and ``cat_feature_num``,
    ``embedding_vector_size``, ``max_nnz`` (upper bounds); here the network file decides them
    all, so a width that differs, or a bound below what the network takes, is named."""
    try:
        _, layout = load_ranking_graph(model)
    except HPSError:
        return []  # the model's load names what is wrong with its files
    given = {
        key: sum(
            _number({key: v}, key, int, f"{where} parameters")
            for v in params[key].split(",")
            if v.strip()
        )
        for key in (*_WIDTHS, *_BOUNDS)
        if key in params
    }
    network = {  # what the network takes: a count, its noun, and of what
        "label_dim": (layout.label_dim, "prediction", "per sample"),
        "slots": (layout.total_slots, "slot", "per sample"),
        "des_feature_num": (layout.dense_dim, "dense feature", "per sample"),
        "cat_feature_num": (layout.sample_width, "key", "per sample (one per slot at least)"),
        "embedding_vector_size": (
            max(t.vec_size for t in layout.tables),
            "float",
            "per embedding vector (its widest)",
        ),
        "max_nnz": (max(layout.hotness), "key", "per slot (at least)"),
    }
    notes = []
    for key, value in given.items():
        wanted, noun, of = network[key]
        if value != wanted if key in _WIDTHS else value < wanted:
            notes.append(
                f"{key} {value} is not honoured: the network file takes "
                f"{plural(wanted, noun)} {of} and decides it here (HugeCTR sizes its buffers "
                "by this parameter)"
            )
    return notes


def _serving_options(user: pb.ModelConfig, gpu: bool) -> tuple[ServingOptions, list[str]]:
    """Batching and placement of the user's config.pbtxt (and notes on what changed)."""
    notes = []
    groups = []
    for group in user.instance_group or [
        pb.ModelInstanceGroup(kind=pb.ModelInstanceGroup.KIND_GPU)
    ]:
        kind = pb.ModelInstanceGroup.Kind.Name(group.kind)
        if kind == "KIND_GPU" and not gpu:
            notes.append("no usable GPU here: its KIND_GPU instances run as KIND_CPU")
            kind = "KIND_CPU"
        gpus = tuple(group.gpus) if kind == "KIND_GPU" else ()
        groups.append(InstanceGroup(count=group.count or 1, kind=kind, gpus=gpus))
    delay = ServingOptions().max_queue_delay_us
    if user.HasField("dynamic_batching"):
        delay = user.dynamic_batching.max_queue_delay_microseconds
    elif user.max_batch_size > 0:
        notes.append(
            f"dynamic_batching added (max_queue_delay_microseconds {delay}): concurrent "
            "requests are batched into one lookup and one forward pass"
        )
    options = ServingOptions(
        max_batch_size=user.max_batch_size,  # 0: unbatched, as Triton reads it
        max_queue_delay_us=delay,
        instances=tuple(groups),
    )
    return options, notes


def _carry_over(path: Path, user: pb.ModelConfig, precision: str | None, ps_json: Path) -> None:
    """Give the written config.pbtxt the user's version policy, the network precision,
    unbatched, the user's tensor shapes, and the user's ps.json (which the model's load log
    and errors name, and whose warnings it logs, as ``hps check`` prints them)."""
    config = read_config(path)
    config.parameters[SOURCE_PS_JSON_PARAMETER].string_value = str(ps_json)
    if user.HasField("version_policy"):
        config.version_policy.CopyFrom(user.version_policy)
    if config.max_batch_size == 0:
        # Unbatched, a request's tensors are whole: keep the shapes the user's clients send
        # (HugeCTR's ensemble samples declare KEYS [-1, -1], others [-1]), and a warm-up
        # request of the same ranks.
        declared = {t.name: list(t.dims) for t in (*user.input, *user.output)}
        for tensor in (*config.input, *config.output):
            if tensor.name in declared:
                del tensor.dims[:]
                tensor.dims.extend(declared[tensor.name])
        ranks = {t.name: len(t.dims) for t in config.input}
        for sample in config.model_warmup:
            for name, entry in sample.inputs.items():
                size = math.prod(entry.dims)
                entry.ClearField("dims")
                entry.dims.extend([1] * (ranks[name] - 1) + [size])
    if precision is not None:
        config.parameters[PRECISION_PARAMETER].string_value = precision
    write_config(path, config)


def _path(folder: Path, value: str) -> Path:
    path = Path(value.strip())
    return path if path.is_absolute() else (folder / path).resolve()
