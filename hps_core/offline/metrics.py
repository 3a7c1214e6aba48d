"""Metrics of offline scoring."""

from __future__ import annotations

import numpy as np

from hps_core.errors import RequestError


def auc(labels: np.ndarray, scores: np.ndarray, what: str = "labels") -> float:
    """Area under the ROC curve, as HugeCTR's ``evaluate`` reports it for binary labels.

    Computed exactly from ranks (the Mann-Whitney statistic), tied scores sharing their
    average rank, so it does not depend on a histogram's resolution.

    Args:
        labels: 0/1 labels (any shape; flattened), float or integer.
        scores: predictions of the same number of elements.
        what: where the labels come from, for messages (e.g. ``label column 'label'``).

    Returns:
        The AUC in [0, 1].

    Raises:
        RequestError: sizes differ, a label is not 0 or 1, or one class is missing.

    Example:
        >>> auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
        0.75
    """
    y = np.asarray(labels).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise RequestError(f"AUC: {y.size} labels but {s.size} scores")
    positive = y == 1
    other = ~(positive | (y == 0))
    if other.any():
        first = int(np.flatnonzero(other)[0])
        raise RequestError(
            f"AUC needs labels of 0 and 1 only: {what} holds {y[first]} at row {first}"
        )
    n_pos = int(positive.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise RequestError(f"AUC needs both classes: {n_pos} positive, {n_neg} negative labels")
    order = np.argsort(s, kind="stable")
    ranks = np.empty(s.size, dtype=np.float64)
    sorted_scores = s[order]
    # Average rank (1-based) of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], s.size]
    average = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(average, ends - starts)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
