"""The shape of a facebookresearch/dlrm ``DLRM_Net``, described as that project's flags do.

``dlrm_s_pytorch.py`` builds its model from four flags, and so does this exporter:

- ``--arch-sparse-feature-size D``: the width of every embedding vector;
- ``--arch-embedding-size 1000-500-20``: rows of each table of ``emb_l``, in order;
- ``--arch-mlp-bot 13-64-16``: the bottom MLP, dense input width first; its last width must be
  ``D`` because the dot interaction multiplies it with the embeddings;
- ``--arch-mlp-top 64-32-1``: the top MLP *without* its input width. dlrm computes that width
  for the dot interaction without self-interaction: with ``n = tables + 1`` vectors it is
  ``n * (n - 1) / 2 + D`` (479 for 26 tables of dim 128), and builds the top MLP from
  ``479-64-32-1``.

Every Linear layer is followed by a ReLU except the last one of the top MLP, which is followed
by a Sigmoid (``sigmoid_bot=-1``, ``sigmoid_top=len(ln_top)-2`` in dlrm). ``create_mlp`` puts
each activation right after its Linear in one ``nn.Sequential``, so the ``i``-th Linear of
``bot_l`` has the state-dict keys ``bot_l.{2i}.weight`` ``[out, in]`` and
``bot_l.{2i}.bias`` ``[out]``; table ``t`` is ``emb_l.{t}.weight`` ``[rows, D]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hps_core.errors import ConfigError, Problem

#: Flag names, used as the location of problems with each field.
SPARSE_FEATURE_SIZE_FLAG = "--arch-sparse-feature-size"
EMBEDDING_SIZE_FLAG = "--arch-embedding-size"
MLP_BOT_FLAG = "--arch-mlp-bot"
MLP_TOP_FLAG = "--arch-mlp-top"


def parse_dash_list(text: str, flag: str) -> tuple[int, ...]:
    """Parse a dlrm-style list such as ``13-512-256-128``.

    Args:
        text: the flag's value.
        flag: the flag's name, for the message.

    Returns:
        The positive integers, in order.

    Raises:
        ConfigError: an entry is not a positive integer.

    Example:
        >>> parse_dash_list("13-64-16", "--arch-mlp-bot")
        (13, 64, 16)
    """
    parts = text.split("-")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(
            f"must be positive integers joined by '-', such as 13-64-16; got {text!r}", flag
        )
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class DlrmArch:
    """A ``DLRM_Net`` with dot interaction and no self-interaction.

    Args:
        sparse_feature_size: ``D``, floats per embedding vector.
        embedding_sizes: rows of each table, in ``emb_l`` order.
        bottom_mlp: widths of the bottom MLP, dense input width first.
        top_mlp: widths of the top MLP after the interaction (the interaction width is
            computed, as dlrm does); the last one is the number of predictions per sample.

    Raises:
        ConfigError: listing every inconsistency, each located at its dlrm flag.

    Example:
        >>> arch = DlrmArch(16, (1000, 500, 20), (13, 64, 16), (64, 32, 1))
        >>> arch.interaction_width
        22
        >>> arch.top_layer_sizes
        (22, 64, 32, 1)
    """

    sparse_feature_size: int
    embedding_sizes: tuple[int, ...]
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]

    def __post_init__(self) -> None:
        problems = []
        if self.sparse_feature_size < 1:
            problems.append(
                Problem(SPARSE_FEATURE_SIZE_FLAG, f"must be >= 1, got {self.sparse_feature_size}")
            )
        lists = (
            (EMBEDDING_SIZE_FLAG, self.embedding_sizes, 1, "one table"),
            (MLP_BOT_FLAG, self.bottom_mlp, 2, "the dense width and one layer"),
            (MLP_TOP_FLAG, self.top_mlp, 1, "one layer"),
        )
        for flag, values, least, what in lists:
            if len(values) < least or min(values, default=1) < 1:
                problems.append(
                    Problem(flag, f"needs at least {what}, all widths >= 1; got {list(values)}")
                )
        if self.bottom_mlp and self.bottom_mlp[-1] != self.sparse_feature_size:
            problems.append(
                Problem(
                    MLP_BOT_FLAG,
                    f"last width {self.bottom_mlp[-1]} must equal {SPARSE_FEATURE_SIZE_FLAG} "
                    f"{self.sparse_feature_size}: the dot interaction multiplies the bottom "
                    "MLP's output with the embedding vectors",
                )
            )
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_flags(
        cls, sparse_feature_size: int, embedding_size: str, mlp_bot: str, mlp_top: str
    ) -> DlrmArch:
        """Build from the values of dlrm's four ``--arch-*`` flags.

        Args:
            sparse_feature_size: ``--arch-sparse-feature-size``.
            embedding_size: ``--arch-embedding-size``, e.g. ``"1000-500-20"``.
            mlp_bot: ``--arch-mlp-bot``, e.g. ``"13-64-16"``.
            mlp_top: ``--arch-mlp-top`` without the interaction width, e.g. ``"64-32-1"``.

        Returns:
            The architecture.

        Raises:
            ConfigError: a value does not parse or the values disagree.
        """
        return cls(
            sparse_feature_size,
            parse_dash_list(embedding_size, EMBEDDING_SIZE_FLAG),
            parse_dash_list(mlp_bot, MLP_BOT_FLAG),
            parse_dash_list(mlp_top, MLP_TOP_FLAG),
        )

    @property
    def num_tables(self) -> int:
        """Number of embedding tables (sparse features)."""
        return len(self.embedding_sizes)

    @property
    def dense_dim(self) -> int:
        """Dense features per sample."""
        return self.bottom_mlp[0]

    @property
    def num_vectors(self) -> int:
        """Vectors entering the interaction: the bottom MLP output and one per table."""
        return self.num_tables + 1

    @property
    def interaction_width(self) -> int:
        """Width of dlrm's interaction output: ``n (n - 1) / 2`` dot products plus ``D``."""
        n = self.num_vectors
        return n * (n - 1) // 2 + self.bottom_mlp[-1]

    @property
    def top_layer_sizes(self) -> tuple[int, ...]:
        """dlrm's ``ln_top``: the interaction width, then ``top_mlp``."""
        return (self.interaction_width, *self.top_mlp)

    @property
    def label_dim(self) -> int:
        """Predictions per sample (the top MLP's last width)."""
        return self.top_mlp[-1]

    def flags(self) -> str:
        """The four dlrm flags that describe this architecture, for messages."""
        return (
            f"{SPARSE_FEATURE_SIZE_FLAG} {self.sparse_feature_size} "
            f"{EMBEDDING_SIZE_FLAG} {_dashed(self.embedding_sizes)} "
            f"{MLP_BOT_FLAG} {_dashed(self.bottom_mlp)} {MLP_TOP_FLAG} {_dashed(self.top_mlp)}"
        )

    def linear_prefixes(self, mlp: str) -> tuple[str, ...]:
        """State-dict prefixes of the Linear layers of ``bot_l`` or ``top_l``, in order.

        Args:
            mlp: ``"bot_l"`` or ``"top_l"``.

        Returns:
            ``("bot_l.0", "bot_l.2", ...)``: each Linear is followed by its activation.
        """
        sizes = self.bottom_mlp if mlp == "bot_l" else self.top_layer_sizes
        return tuple(f"{mlp}.{2 * i}" for i in range(len(sizes) - 1))

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every state-dict key of the model and its PyTorch shape, in ``state_dict`` order.

        Returns:
            ``{"emb_l.0.weight": (rows, D), ..., "bot_l.0.weight": (out, in), ...}``.
        """
        shapes: dict[str, tuple[int, ...]] = {
            f"emb_l.{t}.weight": (rows, self.sparse_feature_size)
            for t, rows in enumerate(self.embedding_sizes)
        }
        for mlp, sizes in (("bot_l", self.bottom_mlp), ("top_l", self.top_layer_sizes)):
            for i, prefix in enumerate(self.linear_prefixes(mlp)):
                shapes[f"{prefix}.weight"] = (sizes[i + 1], sizes[i])
                shapes[f"{prefix}.bias"] = (sizes[i + 1],)
        return shapes


def _dashed(values: tuple[int, ...]) -> str:
    return "-".join(str(v) for v in values)
