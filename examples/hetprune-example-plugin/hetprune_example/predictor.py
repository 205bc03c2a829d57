"""``nearest``: inverse-distance-weighted interpolation of the measured points.

Where the polynomial MAP assumes a smooth surface, this predictor assumes
nothing: at a measured (n_attn, n_act) it returns the measurement, elsewhere
a weighted mean of the ``k`` nearest measurements (weight 1 / distance**power).
"""

from __future__ import annotations

import math

from hetprune import HetpruneError


class NearestPredictor:
    """Inverse-distance-weighted mean of the k nearest measured points (exact at measured points)."""

    name = "nearest"

    def __init__(self, k: int = 3, power: float = 2.0):
        if not isinstance(k, int) or k < 1:
            raise HetpruneError(f"nearest predictor: k must be an integer >= 1, got {k!r}")
        if power <= 0:
            raise HetpruneError(f"nearest predictor: power must be > 0, got {power!r}")
        self.k = k
        self.power = power
        self.points: dict[tuple[float, float], float] = {}
        self._report: dict = {}

    def fit(self, points):
        sums: dict[tuple[float, float], list[float]] = {}
        for n_attn, n_act, accuracy in points:
            sums.setdefault((float(n_attn), float(n_act)), []).append(float(accuracy))
        if not sums:
            raise HetpruneError("nearest predictor needs at least 1 measured point; got none")
        # repeated measurements of one split (several seeds) are averaged
        self.points = {xy: sum(accs) / len(accs) for xy, accs in sums.items()}
        loo = []
        if len(self.points) >= 2:
            for xy, acc in self.points.items():
                rest = {p: a for p, a in self.points.items() if p != xy}
                loo.append(abs(self._interpolate(rest, *xy) - acc))
        self._report = {
            "points": len(self.points),
            "mae": 0.0,  # exact at every measured point, by construction
            "loo_mae": sum(loo) / len(loo) if loo else None,
            "k": self.k,
            "power": self.power,
        }
        return self

    def predict(self, n_attn, n_act) -> float:
        if not self.points:
            raise HetpruneError("the nearest predictor must be fitted before it predicts")
        return self._interpolate(self.points, float(n_attn), float(n_act))

    def fit_report(self) -> dict:
        return dict(self._report)

    def _interpolate(self, points: dict, a: float, m: float) -> float:
        if (a, m) in points:
            return points[(a, m)]
        nearest = sorted(points.items(), key=lambda item: math.dist(item[0], (a, m)))[: self.k]
        weights = [math.dist(xy, (a, m)) ** -self.power for xy, _ in nearest]
        return sum(w * acc for w, (_, acc) in zip(weights, nearest)) / sum(weights)
