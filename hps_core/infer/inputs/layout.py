"""Which ps.json table feeds which embedding layer of the dense network, and what a sample is.

The rule: ``sparse_files[i]`` (table ``i`` of the ps.json model) feeds the ``i``-th embedding
layer of the network file in file order, and that table's slots are the ``slot_num`` of the
sparse input the layer reads (its ``bottom`` in the ``Data`` layer).

Why file order of the embedding layers: HugeCTR writes one sparse model folder per embedding
layer in that order when it saves a trained model, and its inference parser takes the vector
sizes of the tables from the embedding layers in that order. It takes the slot counts of the
tables from the ``Data`` layer's ``sparse`` list instead, which is the same order in every
model HugeCTR can serve; where the two orders differ (HugeCTR's own ``wdl_1gpu.json`` lists
``deep_data`` before ``wide_data`` but defines the wide embedding first) HugeCTR would pair a
table with another layer's slot count. Here each table keeps the slot count of the layer it
feeds, so such a file works too.

Everything is checked when a model loads, and every mismatch is one problem naming the ps.json
field: the number of tables, each table's ``embedding_vecsize_per_table`` against the layer's
``embedding_vec_size``, and ``maxnum_catfeature_query_per_table_per_sample`` against the
layer's slot count (a one-hot sample must fit). The widths of a sample (dense features, slots,
predictions) come from the network file; ps.json's ``slot_num``, ``label_dim`` and
``maxnum_des_feature_per_sample`` are not used, as HugeCTR's ps.json parser does not read the
first two either. Where they are given and disagree with the network,
:func:`ps_json_disagreements` says so (a warning: the file still loads, as in HugeCTR).
"""

from __future__ import annotations

from dataclasses import dataclass

from hps_core.config import ModelConfig
from hps_core.errors import ConfigError, ModelFileError, Problem
from hps_core.nn import (
    Combiner,
    EmbeddingLayer,
    NetworkGraph,
    build_graph,
    check_dense_blob_size,
    load_network_json,
)


@dataclass(frozen=True)
class TableFeed:
    """One ps.json table and the embedding layer it feeds.

    Args:
        table: index of the table in the model's ``sparse_files``.
        table_name: ``embedding_table_names[table]``.
        layer: name of the embedding layer.
        slot_num: slots (feature fields) per sample.
        vec_size: embedding vector size.
        combiner: how the keys of one slot are pooled.
        max_keys_per_sample: ``maxnum_catfeature_query_per_table_per_sample[table]``.
        hotness: keys per slot in a request of the samples contract: the ``nnz_per_slot`` of a
            fixed-length sparse input (every sample has that many keys in every slot), else 1.
    """

    table: int
    table_name: str
    layer: str
    slot_num: int
    vec_size: int
    combiner: Combiner
    max_keys_per_sample: int
    hotness: int = 1

    @property
    def sample_width(self) -> int:
        """Keys one sample carries for this table in the samples contract."""
        return self.slot_num * self.hotness


@dataclass(frozen=True)
class RankingLayout:
    """What one sample of a ranking model holds and where its parts go.

    Args:
        model: the ps.json model name.
        dense_dim: dense features per sample.
        label_dim: predictions per sample (the width of the network's output).
        max_batch_size: most samples one request may carry (ps.json ``max_batch_size``).
        tables: one entry per ps.json table, in table order.
    """

    model: str
    dense_dim: int
    label_dim: int
    max_batch_size: int
    tables: tuple[TableFeed, ...]

    @property
    def num_tables(self) -> int:
        """Number of tables."""
        return len(self.tables)

    @property
    def slot_nums(self) -> tuple[int, ...]:
        """Slots per sample of each table."""
        return tuple(t.slot_num for t in self.tables)

    @property
    def total_slots(self) -> int:
        """Slots per sample over all tables."""
        return sum(self.slot_nums)

    @property
    def hotness(self) -> tuple[int, ...]:
        """Keys per slot of each table in the samples contract (1 unless fixed-length)."""
        return tuple(t.hotness for t in self.tables)

    @property
    def sample_width(self) -> int:
        """Keys one sample carries in the samples contract (``sparse`` is ``[B, width]``)."""
        return sum(t.sample_width for t in self.tables)

    def max_keys(self, table: int) -> int:
        """Most keys one request may send to ``table`` (HugeCTR sizes its buffers so).

        Args:
            table: table index.

        Returns:
            ``max_batch_size * maxnum_catfeature_query_per_table_per_sample[table]``.
        """
        return self.max_batch_size * self.tables[table].max_keys_per_sample

    @classmethod
    def from_graph(
        cls, model: ModelConfig, graph: NetworkGraph, where: str = "models[0]"
    ) -> RankingLayout:
        """Pair the tables of ``model`` with the embedding layers of ``graph`` and check them.

        Args:
            model: the ps.json model.
            graph: its network (from ``model.network_file``).
            where: the model's location in the ps.json, for messages (``models[2]``).

        Returns:
            The layout.

        Raises:
            ConfigError: listing every mismatch between the ps.json and the network.
            NotAvailableError: the network has layers the engine cannot run.
        """
        graph.require_runnable()
        layers = [
            (n.spec, n.layer) for n in graph.embeddings if isinstance(n.layer, EmbeddingLayer)
        ]
        network = graph.spec.source
        if len(layers) != len(model.tables):
            names = ", ".join(f"'{spec.name}'" for spec, _ in layers) or "none"
            tables = f"{len(model.tables)} table{'s' if len(model.tables) != 1 else ''}"
            raise ConfigError(
                Problem(
                    f"{where}.sparse_files",
                    f"lists {tables} but the network {network} has "
                    f"{len(layers)} embedding layers ({names}); table i feeds the i-th "
                    "embedding layer in file order",
                )
            )
        problems = []
        feeds = []
        inputs = {sparse.name: sparse for sparse in graph.spec.data.sparse}
        for table, (spec, layer) in zip(model.tables, layers, strict=True):
            at = f"{spec.where()} (bottom '{layer.sparse_input}')"
            hotness = inputs[layer.sparse_input].fixed_hotness or 1
            if table.max_query_per_sample < layer.slot_num * hotness and hotness > 1:
                problems.append(
                    Problem(
                        f"{where}.maxnum_catfeature_query_per_table_per_sample[{table.index}]",
                        f"is {table.max_query_per_sample} but table {table.index} feeds "
                        f"embedding layer {at} with {layer.slot_num} slots of a fixed "
                        f"{hotness} keys each (is_fixed_length); a sample would not fit",
                    )
                )
            if table.dim != layer.vec_size:
                problems.append(
                    Problem(
                        f"{where}.embedding_vecsize_per_table[{table.index}]",
                        f"is {table.dim} but table {table.index} feeds embedding layer "
                        f"{at}, whose embedding_vec_size is {layer.vec_size}",
                    )
                )
            if table.max_query_per_sample < layer.slot_num:
                problems.append(
                    Problem(
                        f"{where}.maxnum_catfeature_query_per_table_per_sample[{table.index}]",
                        f"is {table.max_query_per_sample} but table {table.index} feeds "
                        f"embedding layer {at} with {layer.slot_num} slots; a sample with "
                        "one key per slot would not fit",
                    )
                )
            feeds.append(
                TableFeed(
                    table=table.index,
                    table_name=table.name,
                    layer=spec.name,
                    slot_num=layer.slot_num,
                    vec_size=layer.vec_size,
                    combiner=layer.combiner,
                    max_keys_per_sample=table.max_query_per_sample,
                    hotness=hotness,
                )
            )
        if problems:
            raise ConfigError(problems)
        output = graph.output_shape
        assert output is not None  # known once every layer can run
        return cls(
            model=model.name,
            dense_dim=graph.spec.data.dense_dim,
            label_dim=output.sample_size,
            max_batch_size=model.max_batch_size,
            tables=tuple(feeds),
        )


def ps_json_disagreements(model: ModelConfig, layout: RankingLayout, where: str) -> list[str]:
    """One line per sizing field of the ps.json model that disagrees with its network.

    ``label_dim`` and ``slot_num`` (when given) should equal the network's predictions and
    slots per sample; ``maxnum_des_feature_per_sample`` should hold its dense features. The
    network file decides each of them here.

    Args:
        model: the ps.json model.
        layout: its layout (:meth:`RankingLayout.from_graph`).
        where: the model's location in the ps.json (``models[2]``).

    Returns:
        The lines, empty when the fields agree (or are not given).

    Example:
        >>> ps_json_disagreements(model, layout, "models[0]")  # doctest: +SKIP
        ["models[0].slot_num = 10 (model 'dlrm'): the network takes 26 slots per sample ..."]
    """
    lines = []
    named = f"(model '{model.name}')"
    if model.label_dim is not None and model.label_dim != layout.label_dim:
        lines.append(
            f"{where}.label_dim = {model.label_dim} {named}: the network's output has "
            f"{layout.label_dim} per sample, which is what is served (HugeCTR's ps.json "
            "parser does not read label_dim either)"
        )
    if model.slot_num is not None and model.slot_num != layout.total_slots:
        lines.append(
            f"{where}.slot_num = {model.slot_num} {named}: the network takes "
            f"{layout.total_slots} slots per sample, which is what is served (HugeCTR's "
            "ps.json parser does not read slot_num either)"
        )
    if model.maxnum_des_feature_per_sample < layout.dense_dim:
        lines.append(
            f"{where}.maxnum_des_feature_per_sample = {model.maxnum_des_feature_per_sample} "
            f"{named}: the network takes {layout.dense_dim} dense features per sample; "
            "HugeCTR sizes its dense buffers by this field and would not hold them, here the "
            "network decides"
        )
    return lines


def is_ranking_model(model: ModelConfig) -> bool:
    """Whether a ps.json model has a dense network: ``network_file`` and ``dense_file`` set.

    HugeCTR's own ps.json samples for the ``hps`` backend sometimes name only the dense
    file; such a model is served as an embedding model.
    """
    return model.network_file is not None and model.dense_file is not None


def load_ranking_graph(
    model: ModelConfig, where: str = "models[0]"
) -> tuple[NetworkGraph, RankingLayout]:
    """Read the network file of a ps.json model, pair it with the model's tables, and check
    the dense file's size against it.

    Args:
        model: the ps.json model.
        where: its location in the ps.json, for messages.

    Returns:
        The network graph (every layer runnable) and the layout.

    Raises:
        ConfigError: ``network_file`` or ``dense_file`` is not set, the network file is
            invalid, it disagrees with the ps.json, or the dense file has the wrong size.
        NotAvailableError: the network has layers the engine cannot run.
    """
    missing = [
        Problem(f"{where}.{key}", "is not set; a ranking model needs network_file and dense_file")
        for key in ("network_file", "dense_file")
        if getattr(model, key) is None
    ]
    if missing:
        raise ConfigError(missing)
    graph = build_graph(load_network_json(model.network_file))
    layout = RankingLayout.from_graph(model, graph, where)
    try:
        check_dense_blob_size(model.dense_file, graph.dense_layout())
    except ModelFileError as exc:
        raise ConfigError(Problem(f"{where}.dense_file", str(exc))) from None
    return graph, layout
